// The op table: every fine op of the C ABI declared once (op_table.cpp) — its operands,
// parameters, list, results and shape rules. The generic entry clef_tt_op (abi_ops.cpp) checks
// a call against it, clef_tt_op_table lists it, and backends read their arguments by the names
// it gives (OpArgs in backend.hpp).
#pragma once

#include <string>
#include <vector>

#include "backend.hpp"

namespace clef_tt {

// Every declared op, in the order clef_tt_op_table lists them.
const std::vector<OpDecl>& op_table();
// The op named `name`, or null.
const OpDecl* find_op(const char* name);
// The table as JSON (clef_tt_op_table).
std::string op_table_json();

}  // namespace clef_tt
