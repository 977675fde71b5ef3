#include "cohort/checkpoint/dcp/unpickler.h"

#include <fmt/format.h>

#include <cstring>
#include <map>

#include "cohort/errors.h"

namespace cohort::checkpoint::dcp {
namespace {

using Kind = Pickled::Kind;

// Note [A pickle reader that runs nothing]
// Python's pickle machine calls what a pickle names; this one records the names. A
// class is a kGlobal node, an object made by NEWOBJ or REDUCE is a kObject holding its
// class's name and arguments, and BUILD stores the state on it. Malicious input can
// therefore do nothing but fail to parse or describe odd objects, which the metadata
// reader (reader.cpp) refuses field by field. Every node is owned by the Unpickled
// (references between nodes are plain pointers), so a pickle whose memo makes a cycle
// cannot leak, and nothing walks the graph without a depth bound.
class Machine {
 public:
  Machine(const std::string& bytes, const std::string& source) : in_(bytes), source_(source) {}

  // The root value; its nodes are in `nodes`.
  const Pickled* run() {
    while (true) {
      opcode_at_ = pos_;
      const auto op = static_cast<unsigned char>(take(1)[0]);
      if (op == '.') return pop();
      step(op);
    }
  }

  std::vector<std::unique_ptr<Pickled>> nodes;

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw DataError(fmt::format("{}: not a pickle this reader takes (at byte {}): {}", source_, opcode_at_, what));
  }

  const char* take(std::size_t n) {
    if (n > in_.size() - pos_) fail(fmt::format("it ends {} bytes early", n - (in_.size() - pos_)));
    const char* p = in_.data() + pos_;
    pos_ += n;
    return p;
  }
  std::uint64_t unsigned_le(std::size_t n) {
    const auto* p = reinterpret_cast<const unsigned char*>(take(n));
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
    return v;
  }
  std::size_t length(std::size_t n) {
    const std::uint64_t v = unsigned_le(n);
    if (v > in_.size() - pos_) fail(fmt::format("a length of {} bytes runs past its end", v));
    return static_cast<std::size_t>(v);
  }
  std::string line() {
    const auto end = in_.find('\n', pos_);
    if (end == std::string::npos) fail("a text argument has no end of line");
    std::string s = in_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return s;
  }
  std::int64_t decimal(const std::string& s) {
    try {
      std::size_t used = 0;
      const long long v = std::stoll(s, &used);
      if (used != s.size() && !(used + 1 == s.size() && s.back() == 'L')) fail(fmt::format("'{}' is no integer", s));
      return v;
    } catch (const std::logic_error&) {
      fail(fmt::format("'{}' is no 64-bit integer", s));
    }
  }

  Pickled* make(Kind kind) {
    nodes.push_back(std::make_unique<Pickled>());
    nodes.back()->kind = kind;
    return nodes.back().get();
  }
  Pickled* integer(std::int64_t v) {
    auto* p = make(Kind::kInt);
    p->integer = v;
    return p;
  }
  Pickled* text(Kind kind, std::string s) {
    auto* p = make(kind);
    p->text = std::move(s);
    return p;
  }
  void push(Pickled* p) { stack_.push_back(p); }
  Pickled* pop() {
    if (stack_.size() <= (marks_.empty() ? 0 : marks_.back())) fail("its stack is empty where a value is needed");
    Pickled* p = stack_.back();
    stack_.pop_back();
    return p;
  }
  Pickled* top() {
    if (stack_.size() <= (marks_.empty() ? 0 : marks_.back())) fail("its stack is empty where a value is needed");
    return stack_.back();
  }
  // The values pushed since the last MARK, which is removed.
  std::vector<Pickled*> since_mark() {
    if (marks_.empty()) fail("it has no MARK where one is needed");
    const std::size_t mark = marks_.back();
    marks_.pop_back();
    std::vector<Pickled*> items(stack_.begin() + static_cast<std::ptrdiff_t>(mark), stack_.end());
    stack_.resize(mark);
    return items;
  }
  Pickled* sequence(Kind kind, const std::vector<Pickled*>& items) {
    auto* p = make(kind);
    p->items.assign(items.begin(), items.end());
    return p;
  }
  Pickled* container(Pickled* p, Kind a, Kind b, const char* what) {
    if (!p->is(a) && !p->is(b)) fail(fmt::format("{} onto {}", what, p->describe()));
    return p;
  }
  void set_items(Pickled* dict, const std::vector<Pickled*>& kv) {
    container(dict, Kind::kDict, Kind::kDict, "dict items");
    if (kv.size() % 2 != 0) fail("a dict gets a key without a value");
    for (std::size_t i = 0; i < kv.size(); i += 2) dict->entries.emplace_back(kv[i], kv[i + 1]);
  }
  Pickled* global(const std::string& module, const std::string& name) {
    return text(Kind::kGlobal, module + "." + name);
  }
  // NEWOBJ, REDUCE, OBJ: an object of `callable`'s class made with `args`.
  Pickled* object(const Pickled* callable, const Pickled* args) {
    if (!args->is(Kind::kTuple)) fail(fmt::format("the arguments of {} are {}", callable->describe(), args->describe()));
    auto* p = text(Kind::kObject, callable->is(Kind::kGlobal) ? callable->text : "(" + callable->describe() + ")");
    p->items = args->items;
    return p;
  }
  void memo_put(std::int64_t key) { memo_[key] = top(); }
  void memo_get(std::int64_t key) {
    const auto it = memo_.find(key);
    if (it == memo_.end()) fail(fmt::format("memo entry {} is read before it is written", key));
    push(it->second);
  }

  void step(unsigned char op) {
    switch (op) {
      case 0x80: take(1); return;  // PROTO: every protocol's opcodes are read
      case 0x95: take(8); return;  // FRAME: a hint for buffered readers
      case '(': marks_.push_back(stack_.size()); return;
      case '0':  // POP: as Python's, an empty stack pops its mark
        if (!marks_.empty() && stack_.size() == marks_.back()) since_mark();
        else pop();
        return;
      case '1': since_mark(); return;
      case '2': push(top()); return;
      case 'N': push(make(Kind::kNone)); return;
      case 0x88: case 0x89: {
        auto* p = make(Kind::kBool);
        p->integer = op == 0x88 ? 1 : 0;
        push(p);
        return;
      }
      case 'J': push(integer(static_cast<std::int32_t>(unsigned_le(4)))); return;
      case 'K': push(integer(static_cast<std::int64_t>(unsigned_le(1)))); return;
      case 'M': push(integer(static_cast<std::int64_t>(unsigned_le(2)))); return;
      case 0x8a: case 0x8b: {  // LONG1, LONG4: little-endian two's complement
        const std::size_t n = length(op == 0x8a ? 1 : 4);
        if (n > 8) fail(fmt::format("an integer of {} bytes is beyond 64 bits", n));
        std::uint64_t v = unsigned_le(n);
        if (n > 0 && n < 8 && (v >> (8 * n - 1)) != 0) v |= ~std::uint64_t{0} << (8 * n);
        push(integer(static_cast<std::int64_t>(v)));
        return;
      }
      case 'I': {
        const std::string s = line();
        if (s == "00" || s == "01") {
          auto* p = make(Kind::kBool);
          p->integer = s == "01";
          push(p);
        } else {
          push(integer(decimal(s)));
        }
        return;
      }
      case 'L': push(integer(decimal(line()))); return;
      case 'G': {
        std::uint64_t bits = 0;
        const auto* p = reinterpret_cast<const unsigned char*>(take(8));
        for (int i = 0; i < 8; ++i) bits = (bits << 8) | p[i];  // big-endian
        auto* f = make(Kind::kFloat);
        std::memcpy(&f->real, &bits, sizeof bits);
        push(f);
        return;
      }
      case 'F': {
        auto* f = make(Kind::kFloat);
        const std::string s = line();
        try {
          f->real = std::stod(s);
        } catch (const std::logic_error&) {
          fail(fmt::format("'{}' is no float", s));
        }
        push(f);
        return;
      }
      case 'X': case 0x8c: case 0x8d: case 'T': case 'U': {  // strings (BINSTRING, SHORT_BINSTRING too)
        const std::size_t n = length(op == 0x8c || op == 'U' ? 1 : op == 0x8d ? 8 : 4);
        push(text(Kind::kString, std::string(take(n), n)));
        return;
      }
      case 'B': case 'C': case 0x8e: case 0x96: {  // bytes and bytearray
        const std::size_t n = length(op == 'C' ? 1 : op == 'B' ? 4 : 8);
        push(text(Kind::kBytes, std::string(take(n), n)));
        return;
      }
      case ')': push(make(Kind::kTuple)); return;
      case 't': push(sequence(Kind::kTuple, since_mark())); return;
      case 0x85: case 0x86: case 0x87: {
        std::vector<Pickled*> items(op - 0x84);
        for (auto it = items.rbegin(); it != items.rend(); ++it) *it = pop();
        push(sequence(Kind::kTuple, items));
        return;
      }
      case ']': case 0x8f: push(make(Kind::kList)); return;  // a set is read as a list
      case 'l': case 0x91: push(sequence(Kind::kList, since_mark())); return;
      case 'a': {
        Pickled* v = pop();
        container(top(), Kind::kList, Kind::kList, "APPEND")->items.push_back(v);
        return;
      }
      case 'e': case 0x90: {
        const auto items = since_mark();
        auto* list = container(top(), Kind::kList, Kind::kList, "APPENDS");
        list->items.insert(list->items.end(), items.begin(), items.end());
        return;
      }
      case '}': push(make(Kind::kDict)); return;
      case 'd': {
        auto* dict = make(Kind::kDict);
        set_items(dict, since_mark());
        push(dict);
        return;
      }
      case 's': {
        Pickled* v = pop();
        Pickled* k = pop();
        set_items(top(), {k, v});
        return;
      }
      case 'u': {
        const auto kv = since_mark();
        set_items(top(), kv);
        return;
      }
      case 'c': {
        const std::string module = line();
        push(global(module, line()));
        return;
      }
      case 'i': {  // INST: module, name, the arguments since the mark
        const std::string module = line();
        auto* cls = global(module, line());
        push(object(cls, sequence(Kind::kTuple, since_mark())));
        return;
      }
      case 0x93: {
        const Pickled* name = pop();
        const Pickled* module = pop();
        if (!module->is(Kind::kString) || !name->is(Kind::kString))
          fail(fmt::format("STACK_GLOBAL of {} and {}", module->describe(), name->describe()));
        push(global(module->text, name->text));
        return;
      }
      case 'R': case 0x81: {
        const Pickled* args = pop();
        const Pickled* callable = pop();
        push(object(callable, args));
        return;
      }
      case 0x92: {  // NEWOBJ_EX: the keyword arguments are kept as the state
        const Pickled* kwargs = pop();
        const Pickled* args = pop();
        const Pickled* cls = pop();
        auto* p = object(cls, args);
        if (!kwargs->entries.empty()) p->state = kwargs;
        push(p);
        return;
      }
      case 'o': {  // OBJ: the class and its arguments since the mark
        const auto items = since_mark();
        if (items.empty()) fail("OBJ without a class");
        push(object(items[0], sequence(Kind::kTuple, {items.begin() + 1, items.end()})));
        return;
      }
      case 'b': {
        const Pickled* state = pop();
        Pickled* target = top();
        if (!target->is(Kind::kObject)) fail(fmt::format("BUILD onto {}", target->describe()));
        target->state = state;
        return;
      }
      case 'p': memo_put(decimal(line())); return;
      case 'q': memo_put(static_cast<std::int64_t>(unsigned_le(1))); return;
      case 'r': memo_put(static_cast<std::int64_t>(unsigned_le(4))); return;
      case 0x94: memo_put(static_cast<std::int64_t>(memo_.size())); return;
      case 'g': memo_get(decimal(line())); return;
      case 'h': memo_get(static_cast<std::int64_t>(unsigned_le(1))); return;
      case 'j': memo_get(static_cast<std::int64_t>(unsigned_le(4))); return;
      default:
        fail(fmt::format("opcode 0x{:02x} is not read here (persistent ids, extension registries and "
                         "out-of-band buffers are not part of a checkpoint's metadata)",
                         op));
    }
  }

  const std::string& in_;
  const std::string& source_;
  std::size_t pos_ = 0, opcode_at_ = 0;
  std::vector<Pickled*> stack_;
  std::vector<std::size_t> marks_;
  std::map<std::int64_t, Pickled*> memo_;
};

std::string describe(const Pickled& p, int depth) {
  switch (p.kind) {
    case Kind::kNone: return "None";
    case Kind::kBool: return p.integer ? "True" : "False";
    case Kind::kInt: return std::to_string(p.integer);
    case Kind::kFloat: return fmt::format("{}", p.real);
    case Kind::kString: return p.text.size() <= 40 ? "'" + p.text + "'" : fmt::format("a string of {} bytes", p.text.size());
    case Kind::kBytes: return fmt::format("{} bytes", p.text.size());
    case Kind::kGlobal: return p.text;
    case Kind::kDict: return fmt::format("a dict of {} entries", p.entries.size());
    case Kind::kTuple: case Kind::kList: case Kind::kObject: break;
  }
  const bool object = p.is(Kind::kObject);
  if (depth > 1 || p.items.size() > 8)
    return object ? p.text + "(...)" : fmt::format("a {} of {} items", p.is(Kind::kList) ? "list" : "tuple", p.items.size());
  std::string s = object ? p.text + "(" : p.is(Kind::kList) ? "[" : "(";
  for (std::size_t i = 0; i < p.items.size(); ++i) s += (i ? ", " : "") + describe(*p.items[i], depth + 1);
  return s + (p.is(Kind::kList) ? "]" : ")");
}

}  // namespace

const Pickled* Pickled::find(const std::string& name) const {
  const Pickled* dict = is(Kind::kObject) ? state : this;
  if (dict == nullptr || !dict->is(Kind::kDict)) return nullptr;
  for (const auto& [k, v] : dict->entries)
    if (k->is(Kind::kString) && k->text == name) return v;
  return nullptr;
}

std::string Pickled::describe() const { return dcp::describe(*this, 0); }

Unpickled unpickle(const std::string& bytes, const std::string& source) {
  Machine machine(bytes, source);
  Unpickled result;
  result.root_ = machine.run();
  result.nodes_ = std::move(machine.nodes);
  return result;
}

}  // namespace cohort::checkpoint::dcp
