// Note [Arrival board]'s diagnosis as text, from peers' states alone.
#include <gtest/gtest.h>

#include "cohort/comm/arrival_board.h"

namespace {
using cohort::comm::ArrivalBoard;
using cohort::comm::PeerStatus;

PeerStatus peer(int rank, PeerStatus::State state, std::int64_t seq, std::string op, std::string op_at_seq = "") {
  PeerStatus p;
  p.rank = rank;
  p.state = state;
  p.seq = seq;
  p.op = std::move(op);
  p.op_at_seq = std::move(op_at_seq);
  return p;
}

TEST(ArrivalBoardExplain, RanksInDifferentCollectivesAreNamedWithTheirCollective) {
  auto text = ArrivalBoard::explain(
      0, "broadcast", 9,
      {peer(1, PeerStatus::State::kElsewhere, 9, "all_reduce", "all_reduce"),
       peer(2, PeerStatus::State::kArrived, 9, "broadcast"),
       peer(3, PeerStatus::State::kBehind, 7, "barrier")});
  EXPECT_EQ(text,
            "ranks called different collectives: rank 0 in broadcast #9, rank 1 in all_reduce #9; "
            "not arrived: rank 3 (alive, but still at barrier #7)");
  EXPECT_EQ(ArrivalBoard::missing({peer(1, PeerStatus::State::kElsewhere, 9, "all_reduce", "all_reduce")}),
            std::vector<int>{1});
}

TEST(ArrivalBoardExplain, OnlyWhenEveryRankArrivedInTheSameCollectiveIsTheTransportBlamed) {
  EXPECT_NE(ArrivalBoard::explain(0, "all_reduce", 4, {peer(1, PeerStatus::State::kArrived, 5, "broadcast")})
                .find("transport stalled"),
            std::string::npos);
  EXPECT_EQ(ArrivalBoard::explain(0, "all_reduce", 4, {peer(1, PeerStatus::State::kBehind, 3, "barrier")}),
            "not arrived: rank 1 (alive, but still at barrier #3)");
}

}  // namespace
