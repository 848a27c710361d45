//! The dense products of the encoder, vectorised for the CPU found at run time (AVX2 and FMA
//! on x86-64, NEON on aarch64, scalar elsewhere) through `pulp`, without unsafe code. On
//! x86-64 the weights a product reads next are prefetched while it computes.

use pulp::{Arch, Simd, WithSimd};
use rayon::prelude::*;

/// Rows of `x` per register tile.
const MR: usize = 4;
/// Rows of `w` per register tile: 4 × 3 accumulators, 3 weight vectors and one input vector
/// fill the 16 vector registers of AVX2.
const NR: usize = 3;
/// Rows of `x` per cache block, so a block stays in L2 while every row of `w` passes by.
const MC: usize = 64;

/// Work (multiply-adds) below which a product runs on one thread: splitting costs a wake-up
/// of the other thread, a few microseconds.
const PARALLEL_MIN: usize = 1 << 20;

/// Computes `y = x · wᵀ + bias` for row-major `x` (m × k) and `w` (n × k), the layout of
/// PyTorch's `Linear` weights, so every output is the dot product of two contiguous rows.
/// `y` is m × n, row-major. Large products are split between the threads of the current
/// rayon pool: by rows of `x` when there are many, else by rows of `w`, so a single short
/// sequence (a search query) also uses every core.
pub(crate) fn matmul_t(x: &[f32], w: &[f32], bias: Option<&[f32]>, k: usize, y: &mut [f32]) {
    let m = x.len() / k;
    let n = w.len() / k;
    debug_assert_eq!(x.len(), m * k);
    debug_assert_eq!(w.len(), n * k);
    debug_assert_eq!(y.len(), m * n);
    debug_assert!(bias.is_none_or(|b| b.len() == n));
    if m * n * k < PARALLEL_MIN || rayon::current_num_threads() < 2 {
        serial(x, w, bias, k, y);
    } else if m >= 2 * MC {
        y.par_chunks_mut(MC * n)
            .zip(x.par_chunks(MC * k))
            .for_each(|(y, x)| serial(x, w, bias, k, y));
    } else {
        // Two halves of the outputs, each computed into its own buffer, then interleaved.
        let half = (n / 2).div_ceil(NR) * NR;
        let (w_a, w_b) = w.split_at(half * k);
        let (bias_a, bias_b) = match bias {
            Some(b) => (Some(&b[..half]), Some(&b[half..])),
            None => (None, None),
        };
        let mut y_a = vec![0.0; m * half];
        let mut y_b = vec![0.0; m * (n - half)];
        rayon::join(|| serial(x, w_a, bias_a, k, &mut y_a), || serial(x, w_b, bias_b, k, &mut y_b));
        for ((row, a), b) in
            y.chunks_exact_mut(n).zip(y_a.chunks_exact(half)).zip(y_b.chunks_exact(n - half))
        {
            row[..half].copy_from_slice(a);
            row[half..].copy_from_slice(b);
        }
    }
}

/// Writes the dot product of `query` with each row of `rows` (row-major, `query.len()`
/// columns) into `out`: the similarities of a query to a table of normalised vectors.
pub fn similarities(query: &[f32], rows: &[f32], out: &mut [f32]) {
    if query.is_empty() {
        return out.fill(0.0);
    }
    matmul_t(query, rows, None, query.len(), out);
}

fn serial(x: &[f32], w: &[f32], bias: Option<&[f32]>, k: usize, y: &mut [f32]) {
    let (m, n) = (x.len() / k, w.len() / k);
    #[cfg(target_arch = "x86_64")]
    if let Some(simd) = pulp::x86::V3::try_new() {
        use std::arch::x86_64::_MM_HINT_T0;
        let prefetch = move |value: &f32| {
            simd.sse._mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(value).cast());
        };
        return Simd::vectorize(simd, MatMulT { x, w, bias, k, m, n, y, prefetch });
    }
    Arch::new().dispatch(MatMulT { x, w, bias, k, m, n, y, prefetch: |_: &f32| {} });
}

struct MatMulT<'a, P> {
    x: &'a [f32],
    w: &'a [f32],
    bias: Option<&'a [f32]>,
    k: usize,
    m: usize,
    n: usize,
    y: &'a mut [f32],
    /// Asks the CPU to bring the cache line of a value closer, without waiting for it.
    prefetch: P,
}

/// Floats in a cache line.
const LINE: usize = 16;

impl<P: Fn(&f32) + Copy> WithSimd for MatMulT<'_, P> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let MatMulT { x, w, bias, k, m, n, y, prefetch } = self;
        for m0 in (0..m).step_by(MC) {
            let m1 = (m0 + MC).min(m);
            let tiles = (m1 - m0).div_ceil(MR);
            let mut j = 0;
            while j < n {
                let nr = (n - j).min(NR);
                // A column of tiles reads its rows of `w` from memory at its first tile and
                // from cache at the others; with the few rows of a query, waiting for them
                // took about a sixth of its time. So each tile asks for its share of the next
                // column's rows, which arrive while this column computes.
                let next = &w[((j + nr) * k).min(w.len())..((j + nr + NR) * k).min(w.len())];
                let per_tile = next.len().div_ceil(LINE).div_ceil(tiles);
                let mut ahead = next.iter().step_by(LINE);
                let mut i = m0;
                while i < m1 {
                    let mr = (m1 - i).min(MR);
                    ahead.by_ref().take(per_tile).for_each(prefetch);
                    // The edges of the product get a smaller tile of their own shape: a
                    // dot product at a time runs one chain of dependent multiply-adds, and
                    // a query's last rows would take a third of its time.
                    let block = Block { x, w, k, i, j, y: &mut *y, n };
                    match (mr, nr) {
                        (4, 3) => tile::<S, 4, 3>(simd, block),
                        (3, 3) => tile::<S, 3, 3>(simd, block),
                        (2, 3) => tile::<S, 2, 3>(simd, block),
                        (1, 3) => tile::<S, 1, 3>(simd, block),
                        (4, 2) => tile::<S, 4, 2>(simd, block),
                        (3, 2) => tile::<S, 3, 2>(simd, block),
                        (2, 2) => tile::<S, 2, 2>(simd, block),
                        (1, 2) => tile::<S, 1, 2>(simd, block),
                        (4, _) => tile::<S, 4, 1>(simd, block),
                        (3, _) => tile::<S, 3, 1>(simd, block),
                        (2, _) => tile::<S, 2, 1>(simd, block),
                        _ => tile::<S, 1, 1>(simd, block),
                    }
                    i += mr;
                }
                j += nr;
            }
        }
        if let Some(bias) = bias {
            for row in y.chunks_exact_mut(n) {
                for (out, b) in row.iter_mut().zip(bias) {
                    *out += b;
                }
            }
        }
    }
}

/// Where one register tile reads and writes: rows `i..` of `x`, rows `j..` of `w`, and the
/// outputs at their crossing in `y` (`n` columns).
struct Block<'a> {
    x: &'a [f32],
    w: &'a [f32],
    k: usize,
    i: usize,
    j: usize,
    y: &'a mut [f32],
    n: usize,
}

/// One R × C block of outputs (at most MR × NR), its accumulators held in registers across
/// the whole of `k`.
#[inline(always)]
fn tile<S: Simd, const R: usize, const C: usize>(simd: S, block: Block<'_>) {
    let Block { x, w, k, i, j, y, n } = block;
    let xr: [&[f32]; R] = std::array::from_fn(|r| &x[(i + r) * k..(i + r + 1) * k]);
    let wr: [&[f32]; C] = std::array::from_fn(|c| &w[(j + c) * k..(j + c + 1) * k]);
    let xs: [&[S::f32s]; R] = xr.map(|row| S::as_simd_f32s(row).0);
    let ws: [&[S::f32s]; C] = wr.map(|row| S::as_simd_f32s(row).0);
    // Equal lengths, stated so the loop below runs without bounds checks.
    let len = xs[0].len();
    let xs = xs.map(|row| &row[..len]);
    let ws = ws.map(|row| &row[..len]);
    let mut acc = [[simd.splat_f32s(0.0); C]; R];
    for p in 0..len {
        let wv: [S::f32s; C] = std::array::from_fn(|c| ws[c][p]);
        for (acc_row, xs_row) in acc.iter_mut().zip(&xs) {
            let xv = xs_row[p];
            for (a, wv) in acc_row.iter_mut().zip(wv) {
                *a = simd.mul_add_f32s(xv, wv, *a);
            }
        }
    }
    let tail = len * S::F32_LANES;
    for (r, acc_row) in acc.iter().enumerate() {
        for (c, a) in acc_row.iter().enumerate() {
            let rest: f32 = xr[r][tail..].iter().zip(&wr[c][tail..]).map(|(a, b)| a * b).sum();
            y[(i + r) * n + j + c] = simd.reduce_sum_f32s(*a) + rest;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tiled, vectorised product equals the plain triple loop for shapes that hit every
    /// edge: register tiles of every smaller shape, partial cache blocks, `k` not a multiple
    /// of the lanes, and a query-sized product split between threads.
    #[test]
    fn matmul_t_matches_the_definition() {
        let edges = (1..=9).flat_map(|m| (1..=7).map(move |n| (m, n, 19)));
        let large = [(1, 1, 1), (4, 3, 16), (70, 10, 40), (130, 385, 37), (34, 1152, 384)];
        for (m, n, k) in edges.chain(large) {
            let x: Vec<f32> = (0..m * k).map(|v| ((v * 7919) % 113) as f32 / 57.0 - 1.0).collect();
            let w: Vec<f32> =
                (0..n * k).map(|v| ((v * 104_729) % 97) as f32 / 49.0 - 1.0).collect();
            let bias: Vec<f32> = (0..n).map(|v| v as f32 / 10.0).collect();
            let mut y = vec![0.0; m * n];
            matmul_t(&x, &w, Some(&bias), k, &mut y);
            for r in 0..m {
                for c in 0..n {
                    let want: f32 =
                        (0..k).map(|p| x[r * k + p] * w[c * k + p]).sum::<f32>() + bias[c];
                    let got = y[r * n + c];
                    assert!(
                        (got - want).abs() <= 1e-4 * want.abs().max(1.0),
                        "{m}x{n}x{k} at ({r},{c}): {got} vs {want}"
                    );
                }
            }
        }
    }
}
