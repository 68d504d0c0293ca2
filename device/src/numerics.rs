//! How a device computes and what it keeps: the matrix engine's math fidelity (mantissa bits
//! of the operands the multipliers see), bf16 or f32 accumulation and bf16 activations
//! (Tenstorrent's documentation), and the dtypes of the prefill state it keeps between ops and
//! passes (the KV cache, the DeltaNet gates and recurrent state). The CPU mesh imitates all of
//! them (the matmul's rounding; bf16 rounding of what is kept as bf16); the Tenstorrent backend
//! passes the matmul settings with every `linear` and the kept dtypes when the mesh opens,
//! where a backend that cannot keep one refuses to open.

/// Math fidelity of the Tenstorrent matrix engine: how many mantissa bits of the weights
/// (srcA, 1 hidden + 4 per phase) and of the activations (srcB, 1 hidden + 6, then the rest)
/// the multipliers use (Tenstorrent's documentation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Fidelity {
    /// No truncation (the plain CPU product).
    #[default]
    Exact,
    LoFi,
    HiFi2,
    HiFi3,
    HiFi4,
}

impl Fidelity {
    pub fn parse(name: &str) -> Option<Self> {
        match name.trim().to_ascii_lowercase().as_str() {
            "exact" | "none" => Some(Fidelity::Exact),
            "lofi" => Some(Fidelity::LoFi),
            "hifi2" => Some(Fidelity::HiFi2),
            "hifi3" => Some(Fidelity::HiFi3),
            "hifi4" => Some(Fidelity::HiFi4),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Fidelity::Exact => "exact",
            Fidelity::LoFi => "LoFi",
            Fidelity::HiFi2 => "HiFi2",
            Fidelity::HiFi3 => "HiFi3",
            Fidelity::HiFi4 => "HiFi4",
        }
    }

    /// f32 bit masks keeping the weight and activation mantissa bits the multipliers see.
    /// LoFi: 4 weight bits, 6 activation bits; HiFi2: all bf16 weight bits (8 ≥ 7), 6
    /// activation bits; HiFi3 and HiFi4: all bits.
    pub(crate) fn masks(self) -> (u32, u32) {
        const ALL: u32 = u32::MAX;
        const FOUR: u32 = 0xFFF8_0000;
        const SIX: u32 = 0xFFFE_0000;
        match self {
            Fidelity::Exact | Fidelity::HiFi3 | Fidelity::HiFi4 => (ALL, ALL),
            Fidelity::LoFi => (FOUR, SIX),
            Fidelity::HiFi2 => (ALL, SIX),
        }
    }
}

/// The dtype a device keeps a class of tensors in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Kept {
    #[default]
    F32,
    Bf16,
}

impl Kept {
    pub fn name(self) -> &'static str {
        match self {
            Kept::F32 => "f32",
            Kept::Bf16 => "bf16",
        }
    }

    /// `values` as this dtype keeps them (bf16: rounded to nearest even, as ttnn's typecast).
    pub fn keep(self, values: &mut [f32]) {
        if self == Kept::Bf16 {
            for v in values {
                *v = half::bf16::from_f32(*v).to_f32();
            }
        }
    }
}

/// A class of tensors a device keeps, for sizing what it holds ([`crate::MeshOps::held_bytes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// Activations (the conv carry too).
    Activation,
    /// K and V rows of the KV cache.
    KvCache,
    /// A DeltaNet layer's recurrent state.
    DeltaNetState,
}

/// How a device computes and keeps: the matrix engine as the CPU matmul imitates it, and the
/// dtypes of the KV cache and the DeltaNet gates and state. The default is the plain f32
/// product with everything kept in f32.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Numerics {
    /// Activations are rounded to bf16 first (the device holds them in bf16 tiles).
    pub bf16_activations: bool,
    pub fidelity: Fidelity,
    /// Accumulators are rounded to bf16 after every 32 input channels (a bf16 destination
    /// register, `fp32_dest_acc_en = false`); otherwise they stay f32.
    pub bf16_accumulation: bool,
    /// The KV cache's dtype: the K and V rows attention reads, this pass's and earlier ones.
    pub kv_cache: Kept,
    /// The DeltaNet gates' dtype (`g` and `beta` as the delta rule reads them).
    pub gdn_gates: Kept,
    /// The DeltaNet recurrent state's dtype between passes (and in the prefix cache).
    pub gdn_state: Kept,
}

impl Numerics {
    /// These numerics with the KV cache kept in bf16, which every backend keeps (the ttnn
    /// backend keeps no other): for a mesh opened only to place or report.
    pub fn with_bf16_kv(self) -> Self {
        Numerics {
            kv_cache: Kept::Bf16,
            ..self
        }
    }

    /// The matrix engine computes the plain f32 product.
    pub(crate) fn exact_matmul(&self) -> bool {
        !self.bf16_activations && self.fidelity == Fidelity::Exact && !self.bf16_accumulation
    }

    /// The dtype `class` is kept in under these numerics.
    pub fn kept(&self, class: Held) -> Kept {
        match class {
            Held::Activation if self.bf16_activations => Kept::Bf16,
            Held::Activation => Kept::F32,
            Held::KvCache => self.kv_cache,
            Held::DeltaNetState => self.gdn_state,
        }
    }
}
