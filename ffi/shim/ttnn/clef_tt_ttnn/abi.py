"""The C enums of ffi/include/clef_tt.h (generated from it by ffi/regenerate-bindings.sh,
through ffi/abi_enums.py: never edit by hand). The bridge passes these integers through
unchanged."""

# clef_tt_status
OK = 0
INVALID_ARGUMENT = 1
DEVICE_ERROR = 2
OUT_OF_MEMORY = 3
INTERNAL = 4
UNSUPPORTED = 5

# clef_tt_dtype
F32 = 0
BF16 = 1
BFP8_B = 2
BFP4_B = 3

# clef_tt_layout
ROW_MAJOR = 0
TILE = 1

# clef_tt_role
ACTIVATION = 0
MATRIX = 1
VECTOR = 2

# clef_tt_placement
REPLICATED = 0
SHARDED = 1
PARTIAL = 2

# clef_tt_fidelity
EXACT = 0
LOFI = 1
HIFI2 = 2
HIFI3 = 3
HIFI4 = 4

# clef_tt_gelu_kind
GELU_TANH = 0
GELU_ERF = 1
