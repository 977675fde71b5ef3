#pragma once
// c10::Event's timing across LibTorch versions: from 2.4 it times two events recorded
// with EventFlag::BACKEND_DEFAULT (elapsedTime, in milliseconds); 1.13's c10::Event
// can only record and query. The timeline's device
// clock (trace/event_clock.cpp) needs the timing, so on 1.13 it reports itself
// unavailable (1.13 from Debian has no CUDA anyway).
#include <c10/core/Event.h>
#include <torch/version.h>

namespace cohort::compat {

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
inline constexpr bool kEventsAreTimed = true;
inline constexpr c10::EventFlag kTimedEvent = c10::EventFlag::BACKEND_DEFAULT;
inline double elapsed_ms(const c10::Event& from, const c10::Event& to) { return from.elapsedTime(to); }
#else
inline constexpr bool kEventsAreTimed = false;
inline constexpr c10::EventFlag kTimedEvent = c10::EventFlag::PYTORCH_DEFAULT;
inline double elapsed_ms(const c10::Event&, const c10::Event&) { return 0; }  // never called: kEventsAreTimed
#endif

}  // namespace cohort::compat
