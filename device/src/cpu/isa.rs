//! The vector instruction set the CPU kernels use, detected once per process: AVX-512 (with or
//! without AVX512-BF16), AVX2 + FMA, or portable code. `CLEF_CPU_ISA` (`avx512`, `avx2`,
//! `portable`) lowers the choice, for tests and comparisons; it never raises it above what the
//! CPU has.

use std::sync::OnceLock;

/// The kernels' instruction set, best first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    Portable,
    Avx2Fma,
    Avx512,
    Avx512Bf16,
}

impl Isa {
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2Fma => "avx2+fma",
            Isa::Avx512 => "avx512f",
            Isa::Avx512Bf16 => "avx512f+avx512bf16",
        }
    }

    /// What this CPU supports.
    pub fn detected() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                if std::arch::is_x86_feature_detected!("avx512bf16") {
                    return Isa::Avx512Bf16;
                }
                return Isa::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Isa::Avx2Fma;
            }
        }
        Isa::Portable
    }

    /// `CLEF_CPU_ISA`'s lowering of `detected` (an unknown value changes nothing).
    fn lowered(detected: Isa, asked: Option<&str>) -> Isa {
        let cap = match asked.map(str::trim) {
            Some("portable") => Isa::Portable,
            Some("avx2") => Isa::Avx2Fma,
            Some("avx512") => Isa::Avx512Bf16,
            _ => return detected,
        };
        detected.min(cap)
    }
}

/// The instruction set of this process (detected on first use).
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        Isa::lowered(
            Isa::detected(),
            std::env::var("CLEF_CPU_ISA").ok().as_deref(),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_override_only_lowers() {
        assert_eq!(Isa::lowered(Isa::Avx2Fma, Some("avx512")), Isa::Avx2Fma);
        assert_eq!(Isa::lowered(Isa::Avx512Bf16, Some("avx2")), Isa::Avx2Fma);
        assert_eq!(Isa::lowered(Isa::Avx512, Some("portable")), Isa::Portable);
        assert_eq!(Isa::lowered(Isa::Avx512, Some("banana")), Isa::Avx512);
        assert_eq!(Isa::lowered(Isa::Avx512, None), Isa::Avx512);
    }
}
