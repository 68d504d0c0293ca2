//! How a device's matrix engine computes a product: math fidelity (mantissa bits of the
//! operands the multipliers see), bf16 or f32 accumulation and bf16 activations
//! (Tenstorrent's documentation). The CPU mesh imitates them in its matmul; the Tenstorrent backend
//! passes them to the device with every `linear`.

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

/// How closely the CPU matmul imitates the device's matrix engine. The default is the plain
/// f32 product.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Numerics {
    /// Activations are rounded to bf16 first (the device holds them in bf16 tiles).
    pub bf16_activations: bool,
    pub fidelity: Fidelity,
    /// Accumulators are rounded to bf16 after every 32 input channels (a bf16 destination
    /// register, `fp32_dest_acc_en = false`); otherwise they stay f32.
    pub bf16_accumulation: bool,
}

impl Numerics {
    pub(crate) fn is_exact(&self) -> bool {
        *self == Numerics::default()
    }
}
