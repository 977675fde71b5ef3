int main() { return 0; }  // only carries the tests' precompiled header
