#pragma once
// An optimizer whose state is spread over the ranks (zero::ShardedOptimizer) gathers
// it to one rank before that rank writes it. Checkpointer::save, which every rank
// calls, does so for any optimizer that implements this; a program that saves an
// optimizer itself calls gather_state() on every rank first.
namespace cohort::checkpoint {

class GathersStateForSave {
 public:
  virtual ~GathersStateForSave() = default;
  // Collective over the optimizer's ranks: afterwards save() on the process of
  // global rank `writer` writes the whole state, as one optimizer over every
  // parameter would hold it. A failure there is raised by that save().
  virtual void gather_state_for_save(int writer) const = 0;
  // Frees what gather_state() brought to this rank.
  virtual void release_gathered_state() const = 0;
};

}  // namespace cohort::checkpoint
