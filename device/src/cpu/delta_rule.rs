//! The gated delta rule on the CPU, per value head: the chunked form the prefill uses and the
//! token-by-token recurrence it is tested against (Qwen3.5's architecture).
//!
//! Inputs of one head: `q`, `k` `[T, dk]` (already L2-normalised; q scaled), `v` `[T, dv]`,
//! the log-decay `g` `[T]` and `beta` `[T]`; the state `S` is `[dk, dv]`, fp32.

use super::denormals::FlushDenormals;
use super::exp::exp_in_place;
use super::matmul::small_matmul;

/// Chunk length of the chunked form (as in Hugging Face's `torch_chunk_gated_delta_rule`).
pub const CHUNK: usize = 64;

/// One head's inputs, borrowed row-major.
pub struct HeadInputs<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub g: &'a [f32],
    pub beta: &'a [f32],
    pub key_dim: usize,
    pub value_dim: usize,
}

impl HeadInputs<'_> {
    fn len(&self) -> usize {
        self.g.len()
    }
}

/// Token loop: `S ← e^{g}S; u = β(v − Sᵀk); S ← S + k⊗u; o = Sᵀq`. Writes `out` `[T, dv]`.
pub fn recurrent(h: &HeadInputs, state: &mut [f32], out: &mut [f32]) {
    let _ftz = FlushDenormals::new();
    let (dk, dv) = (h.key_dim, h.value_dim);
    let mut u = vec![0.0f32; dv];
    for t in 0..h.len() {
        let decay = h.g[t].exp();
        state.iter_mut().for_each(|s| *s *= decay);
        let kt = &h.k[t * dk..(t + 1) * dk];
        u.copy_from_slice(&h.v[t * dv..(t + 1) * dv]);
        for (i, &ki) in kt.iter().enumerate() {
            for (uj, sj) in u.iter_mut().zip(&state[i * dv..(i + 1) * dv]) {
                *uj -= ki * sj;
            }
        }
        u.iter_mut().for_each(|x| *x *= h.beta[t]);
        for (i, &ki) in kt.iter().enumerate() {
            for (sj, uj) in state[i * dv..(i + 1) * dv].iter_mut().zip(&u) {
                *sj += ki * uj;
            }
        }
        let o = &mut out[t * dv..(t + 1) * dv];
        o.fill(0.0);
        for (i, &qi) in h.q[t * dk..(t + 1) * dk].iter().enumerate() {
            for (oj, sj) in o.iter_mut().zip(&state[i * dv..(i + 1) * dv]) {
                *oj += qi * sj;
            }
        }
    }
}

/// Chunked form: per chunk of [`CHUNK`] tokens, solve the unit lower-triangular system for the
/// corrected values with forward substitution, then read and update the state with matmuls.
/// A shorter last chunk is exact (Hugging Face zero-pads it, which changes nothing).
pub fn chunked(h: &HeadInputs, state: &mut [f32], out: &mut [f32]) {
    let _ftz = FlushDenormals::new();
    let (dk, dv) = (h.key_dim, h.value_dim);
    let mut w = Workspace::new(dk, dv);
    let mut start = 0;
    while start < h.len() {
        let len = CHUNK.min(h.len() - start);
        w.chunk(
            h,
            start,
            len,
            state,
            &mut out[start * dv..(start + len) * dv],
        );
        start += len;
    }
}

/// `out[j] = e^{Γ_i − Γ_j}` for `j < len`, with the vectorised `exp`.
fn decay_row(gamma: &[f32], i: usize, len: usize, out: &mut [f32]) {
    let out = &mut out[..len];
    out.iter_mut()
        .zip(gamma)
        .for_each(|(o, g)| *o = gamma[i] - g);
    exp_in_place(out);
}

/// Scratch buffers reused across the chunks of one head.
struct Workspace {
    dk: usize,
    dv: usize,
    gamma: Vec<f32>,
    tmat: Vec<f32>,
    kk: Vec<f32>,
    vbeta: Vec<f32>,
    kbeta_decay: Vec<f32>,
    u: Vec<f32>,
    wk: Vec<f32>,
    qdecay: Vec<f32>,
    kdecay: Vec<f32>,
}

impl Workspace {
    fn new(dk: usize, dv: usize) -> Self {
        let c = CHUNK;
        Workspace {
            dk,
            dv,
            gamma: vec![0.0; c],
            tmat: vec![0.0; c * c],
            kk: vec![0.0; c * c],
            vbeta: vec![0.0; c * dv],
            kbeta_decay: vec![0.0; c * dk],
            u: vec![0.0; c * dv],
            wk: vec![0.0; c * dk],
            qdecay: vec![0.0; c * dk],
            kdecay: vec![0.0; c * dk],
        }
    }

    fn chunk(&mut self, h: &HeadInputs, s: usize, n: usize, state: &mut [f32], out: &mut [f32]) {
        let (dk, dv) = (self.dk, self.dv);
        let q = &h.q[s * dk..(s + n) * dk];
        let k = &h.k[s * dk..(s + n) * dk];
        let v = &h.v[s * dv..(s + n) * dv];
        let beta = &h.beta[s..s + n];
        // Cumulative log-decay inside the chunk.
        let mut acc = 0.0f32;
        for (gam, &g) in self.gamma.iter_mut().zip(&h.g[s..s + n]) {
            acc += g;
            *gam = acc;
        }
        let gamma = &self.gamma[..n];
        // kk = K Kᵀ (n x n).
        small_matmul(n, n, dk, &mut self.kk, false, k, dk, 1, k, 1, dk);
        // Strictly lower A_ij = -β_i (k_i·k_j) e^{Γ_i-Γ_j}; forward substitution gives
        // T = (I + A')^{-1} row by row, as the reference computes it.
        // Row i is T_i = A_i + Σ_{m<i} A_im T_m over columns j < m: as axpys over ascending m,
        // which adds each column's terms in the order of the scalar recurrence (same bits).
        let t = &mut self.tmat[..n * n];
        t.fill(0.0);
        for i in 0..n {
            let (done, rest) = t.split_at_mut(i * n);
            let row = &mut rest[..n];
            decay_row(gamma, i, i, row);
            for (j, x) in row[..i].iter_mut().enumerate() {
                *x *= -beta[i] * self.kk[i * n + j];
            }
            for m in 1..i {
                let a = row[m];
                let tm = &done[m * n..m * n + m];
                row[..m].iter_mut().zip(tm).for_each(|(x, t)| *x += a * t);
            }
            row[i] = 1.0;
        }
        // U = T (β ⊙ V), Wk = T (β ⊙ K ⊙ e^{Γ}).
        for i in 0..n {
            for c in 0..dv {
                self.vbeta[i * dv + c] = v[i * dv + c] * beta[i];
            }
            let f = beta[i] * gamma[i].exp();
            for c in 0..dk {
                self.kbeta_decay[i * dk + c] = k[i * dk + c] * f;
            }
        }
        small_matmul(n, dv, n, &mut self.u, false, t, n, 1, &self.vbeta, dv, 1);
        small_matmul(
            n,
            dk,
            n,
            &mut self.wk,
            false,
            t,
            n,
            1,
            &self.kbeta_decay,
            dk,
            1,
        );
        // v_new = U − Wk S.
        for x in self.wk[..n * dk].iter_mut() {
            *x = -*x;
        }
        small_matmul(n, dv, dk, &mut self.u, true, &self.wk, dk, 1, state, dv, 1);
        // O = (Q ⊙ e^{Γ}) S + ((Q Kᵀ) ⊙ decay, diagonal included) v_new.
        for i in 0..n {
            let f = gamma[i].exp();
            for c in 0..dk {
                self.qdecay[i * dk + c] = q[i * dk + c] * f;
            }
        }
        small_matmul(n, dv, dk, out, false, &self.qdecay, dk, 1, state, dv, 1);
        small_matmul(n, n, dk, &mut self.kk, false, q, dk, 1, k, 1, dk);
        let mut decay = [0.0f32; CHUNK];
        for i in 0..n {
            decay_row(gamma, i, i + 1, &mut decay);
            let row = &mut self.kk[i * n..(i + 1) * n];
            row.iter_mut().zip(&decay).for_each(|(x, d)| *x *= d);
            row[i + 1..].fill(0.0);
        }
        small_matmul(n, dv, n, out, true, &self.kk, n, 1, &self.u, dv, 1);
        // S ← e^{Γ_last} S + (K ⊙ e^{Γ_last − Γ})ᵀ v_new.
        let last = gamma[n - 1];
        let decay = last.exp();
        state.iter_mut().for_each(|x| *x *= decay);
        for i in 0..n {
            let f = (last - gamma[i]).exp();
            for c in 0..dk {
                self.kdecay[i * dk + c] = k[i * dk + c] * f;
            }
        }
        small_matmul(dk, dv, n, state, true, &self.kdecay, 1, dk, &self.u, dv, 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic pseudo-random sequence in [-1, 1).
    fn noise(n: usize, seed: u64) -> Vec<f32> {
        let mut x = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    fn l2_rows(x: &mut [f32], d: usize, scale: f32) {
        for r in x.chunks_mut(d) {
            let n = (r.iter().map(|v| v * v).sum::<f32>() + 1e-6).sqrt();
            r.iter_mut().for_each(|v| *v = *v / n * scale);
        }
    }

    #[test]
    fn chunked_equals_the_token_loop_across_chunks_and_with_a_starting_state() {
        let (t, dk, dv) = (150, 16, 12);
        let mut q = noise(t * dk, 1);
        let mut k = noise(t * dk, 2);
        l2_rows(&mut q, dk, (dk as f32).powf(-0.5));
        l2_rows(&mut k, dk, 1.0);
        let v = noise(t * dv, 3);
        let g: Vec<f32> = noise(t, 4).iter().map(|x| -0.05 - 0.5 * x.abs()).collect();
        let beta: Vec<f32> = noise(t, 5).iter().map(|x| 0.5 + 0.4 * x).collect();
        let h = HeadInputs {
            q: &q,
            k: &k,
            v: &v,
            g: &g,
            beta: &beta,
            key_dim: dk,
            value_dim: dv,
        };
        let start = noise(dk * dv, 6);
        let (mut s1, mut s2) = (start.clone(), start);
        let (mut o1, mut o2) = (vec![0.0; t * dv], vec![0.0; t * dv]);
        recurrent(&h, &mut s1, &mut o1);
        chunked(&h, &mut s2, &mut o2);
        let max_o = o1
            .iter()
            .zip(&o2)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        let max_s = s1
            .iter()
            .zip(&s2)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(max_o < 1e-5, "output differs by {max_o}");
        assert!(max_s < 1e-5, "state differs by {max_s}");
    }
}
