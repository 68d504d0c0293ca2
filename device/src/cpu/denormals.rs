//! Flush-to-zero for the exp-heavy kernels.
//!
//! Strong DeltaNet decays (`g` of -20 per token is ordinary) and attention tails produce
//! subnormal f32 values, which the x86 FPU handles about a hundred times slower than normal
//! ones. Inside those kernels a guard sets FTZ and DAZ in MXCSR and restores the caller's mode
//! when dropped; values below 1.2e-38 become 0, far below every tolerance of the model.

/// Sets FTZ|DAZ for its lifetime on the current thread (a no-op off x86-64).
pub struct FlushDenormals {
    #[cfg(target_arch = "x86_64")]
    saved: u32,
}

#[cfg(target_arch = "x86_64")]
impl FlushDenormals {
    const FTZ_DAZ: u32 = 0x8040;

    pub fn new() -> Self {
        let mut saved: u32 = 0;
        // SAFETY: stmxcsr/ldmxcsr only read and write the SSE control register of this thread;
        // FTZ and DAZ change no state other than how subnormal values are treated.
        unsafe {
            std::arch::asm!("stmxcsr [{}]", in(reg) &mut saved, options(nostack));
            let mode = saved | Self::FTZ_DAZ;
            std::arch::asm!("ldmxcsr [{}]", in(reg) &mode, options(nostack, readonly));
        }
        FlushDenormals { saved }
    }
}

#[cfg(target_arch = "x86_64")]
impl Drop for FlushDenormals {
    fn drop(&mut self) {
        // SAFETY: restores the mode saved in `new` on the same thread.
        unsafe {
            std::arch::asm!("ldmxcsr [{}]", in(reg) &self.saved, options(nostack, readonly));
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
impl FlushDenormals {
    pub fn new() -> Self {
        FlushDenormals {}
    }
}

impl Default for FlushDenormals {
    fn default() -> Self {
        Self::new()
    }
}
