#include "cohort/launcher/line_splitter.h"

namespace cohort::launcher {

void LineSplitter::feed(const char* data, std::size_t size, const Emit& emit, const Emit& status,
                        const Emit& done) {
  for (std::size_t i = 0; i < size; ++i) {
    if (data[i] == '\n') {
      if (pending_.empty() && after_status_)
        (done ? done : emit)(last_status_);
      else
        emit(pending_);
      pending_.clear();
      after_status_ = false;
      continue;
    }
    if (data[i] == '\r' && status) {
      if (!pending_.empty()) {
        status(pending_);
        last_status_.swap(pending_);
        pending_.clear();
        after_status_ = true;
      }
      continue;
    }
    after_status_ = false;
    pending_.push_back(data[i]);
    if (pending_.size() == kMaxLine) {
      emit(pending_);
      pending_.clear();
    }
  }
}

void LineSplitter::finish(const Emit& emit, const Emit& done) {
  if (!pending_.empty())
    emit(pending_);
  else if (after_status_)
    (done ? done : emit)(last_status_);
  pending_.clear();
  after_status_ = false;
}

}  // namespace cohort::launcher
