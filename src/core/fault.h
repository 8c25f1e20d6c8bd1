// Fault injection for the failure tests: TANDEM_FAULT="<rank>:<point>:<action>" makes the
// process of that world rank exit (std::_Exit(3)) or hang (sleep forever) when it reaches
// the named point: "step<N>" (inside the compute of optimizer step N, counted from 1 as in the
// metrics) or "save" (after its checkpoint shard is durable, before the index is written). Unset,
// it costs one cached environment lookup per point.
#pragma once

#include <cstdint>
#include <string>

namespace tandem {

// point: "step" with the step number, or "save" (number ignored).
void fault_point(const std::string& point, int64_t number);

}  // namespace tandem
