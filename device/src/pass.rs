//! A whole prefill pass as one backend call ([`crate::MeshOps::prefill_pass`]): every decoder
//! layer, the final norm and the rows read back. A backend that runs it can replay the pass
//! from a captured trace (the ttnn backend: `ffi/shim/ttnn/clef_tt_ttnn/passes.py`) instead of
//! dispatching its ~1,600 device ops one by one; the layer ops it is made of stay the
//! definition, and a backend that does not run a pass leaves the caller to run the layers.

use crate::{AttentionSpec, DeltaNetSpec, HostTensor, RopeSpec, RowBatch};

/// A layer's mixer sublayer in a pass: its weights, the state it continues (absent at a
/// sequence's start) and its shape, as the layer op takes it (without the residual stream).
pub enum PassMixer<'a, T, W> {
    Attention {
        norm: &'a W,
        qkv: &'a W,
        q_norm: &'a W,
        k_norm: &'a W,
        o_proj: &'a W,
        /// The layer's keys and values from earlier chunks.
        cache: Option<(&'a T, &'a T)>,
        spec: AttentionSpec,
        rope: RopeSpec,
        all_reduce: bool,
    },
    DeltaNet {
        norm: &'a W,
        in_proj: &'a W,
        conv: &'a W,
        a_log: &'a W,
        dt_bias: &'a W,
        gated_norm: &'a W,
        out_proj: &'a W,
        /// The conv carry and the recurrent state from earlier chunks.
        carried: Option<(&'a T, &'a T)>,
        spec: DeltaNetSpec,
        all_reduce: bool,
    },
}

/// One decoder layer of a pass: its mixer and its MLP.
pub struct PassLayer<'a, T, W> {
    pub mixer: PassMixer<'a, T, W>,
    pub post_norm: &'a W,
    pub gate_up: &'a W,
    pub down: &'a W,
    /// Whether the MLP's down projection is all-reduced.
    pub mlp_all_reduce: bool,
}

/// One prompt's chunk through the whole backbone.
pub struct PrefillPass<'a, T, W> {
    /// The chunk's embedding rows `[T, hidden]`.
    pub rows: &'a HostTensor,
    /// Every row's M-RoPE position.
    pub positions: &'a [[u32; 3]],
    /// The position of the first row (the rows the states already hold).
    pub start: usize,
    pub layers: Vec<PassLayer<'a, T, W>>,
    pub final_norm: &'a W,
    pub eps: f32,
    /// The caller drops the states it passes as soon as the pass returns (the previous
    /// chunk's own): the backend may overwrite them in place instead of keeping them.
    pub consume: bool,
    /// A batched pass ([`RowBatch`]: requests in blocks, `rows` holding every block): fresh
    /// (no layer state given), keeping the state of each request's first `keep[i]` rows, or
    /// every block continuing the layers' states (hits of one prefix-cache slot).
    pub batch: Option<&'a RowBatch>,
}

/// A pass's final rows `[T, hidden]` and the states it leaves, layer by layer: keys and values,
/// or conv carry and recurrent state; one per layer, or for a batch one per kept prefix of
/// each layer (none for a batch that keeps none).
pub struct PassOutput<T> {
    pub hidden: HostTensor,
    pub states: Vec<[T; 2]>,
}

/// What a backend's passes did since it opened.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PassStats {
    /// Whether passes are captured and replayed (the shim's trace mode is "traced").
    pub tracing: bool,
    /// Passes replayed from a trace.
    pub traced: u64,
    /// Passes whose ops were dispatched one by one, by reason ("warming": the first of its
    /// shape, which caches the programs a capture needs; "untraceable"; "tracing off").
    pub eager: Vec<(String, u64)>,
    /// Forms of pass seen (each runs eagerly once, "warming", then is captured).
    pub forms: u64,
    /// Traces held, captured, replayed and released.
    pub traces: u64,
    pub captures: u64,
    pub replays: u64,
    /// The trace region's bytes in use per device (the allocator's count).
    pub trace_region_bytes: u64,
    /// DRAM per device the traces' intermediates keep reserved.
    pub reserved_bytes: u64,
    /// The pass lengths traces are captured for.
    pub buckets: Vec<usize>,
}
