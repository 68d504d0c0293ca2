//! Inputs shared by the device benches.

/// `n` values in [-1, 1) from a xorshift stream seeded by `seed` (the same for every run).
pub fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(2_654_435_761).max(1);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x % 2000) as f32 / 1000.0 - 1.0
        })
        .collect()
}
