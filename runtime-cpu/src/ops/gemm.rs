//! The one matrix product every linear-algebra op uses: `C = A B` in f32 from bf16 operands.
//!
//! **The summation order is the contract.** Each element `C[i][j]` starts at `0.0` and adds
//! `A[i][p] * B[p][j]` for `p = 0, 1, ..., k-1` in that order, one f32 multiply and one f32 add
//! each (Rust never fuses them into an FMA). Nothing else touches it: the contraction is cut into
//! blocks of [`KC`] only to keep operands in cache, and a block boundary stores the running sum
//! in f32 and resumes it, which changes no bit. Rows beyond `m` in a register tile are zero
//! padding whose results are dropped; lanes of a vector are independent IEEE operations. So an
//! element of `C` has the same bits whatever the number of rows in the call, where they start,
//! which tile they fall in and which thread computes them (row-range invariance, `mod.rs`).
//!
//! Layout, after GotoBLAS: `B` is packed once per call into panels of [`NR`] columns (`k x NR`
//! floats each, zero padded); a chunk of up to [`MC`] output rows packs its `A` rows per
//! contraction block as `[p][MR]`, and a `MR x NR` register tile walks them. Threads take whole
//! chunks ([`parallel::for_each_chunk`]).

use super::parallel;
use super::tensor::{bf16_bits_to_f32, BF16};

/// Rows of a register tile.
pub(crate) const MR: usize = 4;
/// Columns of a register tile (two 4-lane vectors on baseline x86-64).
pub(crate) const NR: usize = 8;
/// Contraction block: operands of one block stay in cache. Does not affect results.
const KC: usize = 256;
/// Output rows per chunk: the unit of work of one thread. Does not affect results.
pub(crate) const MC: usize = 64;

/// `B` (`k x n`) packed in panels of [`NR`] columns.
pub(crate) struct PackedB {
    k: usize,
    n: usize,
    data: Vec<f32>,
}

impl PackedB {
    fn zeroed(k: usize, n: usize) -> Self {
        let panels = n.div_ceil(NR);
        PackedB { k, n, data: vec![0.0; panels * k * NR] }
    }

    /// `B[p][j] = rows[j][p]`: `bytes` holds `n` rows of `k` bf16 (a weight `W` for `x W^T`).
    pub(crate) fn from_bf16_transposed(bytes: &[u8], n: usize, k: usize) -> Self {
        let mut b = PackedB::zeroed(k, n);
        if k == 0 {
            return b;
        }
        for (j, row) in bytes.chunks_exact(k * BF16).take(n).enumerate() {
            let (panel, lane) = (j / NR, j % NR);
            let base = panel * k * NR + lane;
            for (p, pair) in row.chunks_exact(BF16).enumerate() {
                if let Some(slot) = b.data.get_mut(base + p * NR) {
                    *slot = bf16_bits_to_f32(pair[0], pair[1]);
                }
            }
        }
        b
    }

    /// `B[p][j] = rows[p][j]`: `bytes` holds `k` rows of `n` bf16.
    pub(crate) fn from_bf16(bytes: &[u8], k: usize, n: usize) -> Self {
        let mut b = PackedB::zeroed(k, n);
        if n == 0 {
            return b;
        }
        for (p, row) in bytes.chunks_exact(n * BF16).take(k).enumerate() {
            for (j, pair) in row.chunks_exact(BF16).enumerate() {
                let (panel, lane) = (j / NR, j % NR);
                if let Some(slot) = b.data.get_mut((panel * k + p) * NR + lane) {
                    *slot = bf16_bits_to_f32(pair[0], pair[1]);
                }
            }
        }
        b
    }

    /// Columns of `C`, padded to whole panels: the row stride of the blocks [`gemm`] hands out.
    pub(crate) fn padded_n(&self) -> usize {
        self.n.div_ceil(NR) * NR
    }

    fn panel(&self, panel: usize, p0: usize, p1: usize) -> &[f32] {
        let base = panel * self.k * NR;
        self.data.get(base + p0 * NR..base + p1 * NR).unwrap_or(&[])
    }
}

/// Where `A` (`m x k`) comes from.
#[derive(Clone, Copy)]
pub(crate) enum ASource<'a> {
    /// `A[i][p] = rows[i][p]`: `m` rows of `k` bf16.
    Rows { bytes: &'a [u8], k: usize },
    /// `A[i][p] = rows[p][i]`: `k` rows of `width` bf16 (`A` is their transpose, `m = width`).
    Columns { bytes: &'a [u8], width: usize },
}

impl ASource<'_> {
    /// Packs rows `[i0, i0 + rows)` (`rows <= MC`), contraction `[p0, p1)`, as `[p][MR]` per
    /// tile of `MR` rows: tile `t` at `t * (p1 - p0)`. Rows past `rows` are zero.
    fn pack(&self, i0: usize, rows: usize, p0: usize, p1: usize, out: &mut [[f32; MR]]) {
        let kc = p1 - p0;
        out.fill([0.0; MR]);
        match *self {
            ASource::Rows { bytes, k } => {
                for r in 0..rows {
                    let start = ((i0 + r) * k + p0) * BF16;
                    let Some(row) = bytes.get(start..start + kc * BF16) else { continue };
                    let tile = &mut out[(r / MR) * kc..(r / MR + 1) * kc];
                    for (slot, pair) in tile.iter_mut().zip(row.chunks_exact(BF16)) {
                        slot[r % MR] = bf16_bits_to_f32(pair[0], pair[1]);
                    }
                }
            }
            ASource::Columns { bytes, width } => {
                for p in p0..p1 {
                    let start = (p * width + i0) * BF16;
                    let Some(row) = bytes.get(start..start + rows * BF16) else { continue };
                    for (r, pair) in row.chunks_exact(BF16).enumerate() {
                        if let Some(slot) = out.get_mut((r / MR) * kc + (p - p0)) {
                            slot[r % MR] = bf16_bits_to_f32(pair[0], pair[1]);
                        }
                    }
                }
            }
        }
    }
}

/// One register tile: `acc[i][j] += a[p][i] * b[p][j]` for each `p` in order.
#[inline(always)]
fn kernel(a: &[[f32; MR]], b: &[[f32; NR]], acc: &mut [[f32; NR]; MR]) {
    let mut t = *acc;
    for (ap, bp) in a.iter().zip(b) {
        for i in 0..MR {
            for j in 0..NR {
                t[i][j] += ap[i] * bp[j];
            }
        }
    }
    *acc = t;
}

/// Rows `[i0, i0 + rows)` of `C = A B` into `c` (`rows` padded to `MR`, times
/// [`PackedB::padded_n`], row-major).
fn block(a: &ASource<'_>, b: &PackedB, i0: usize, rows: usize, c: &mut [f32]) {
    let n_pad = b.padded_n();
    let tiles = rows.div_ceil(MR);
    c.fill(0.0);
    let mut apack = vec![[0.0f32; MR]; tiles * KC.min(b.k.max(1))];
    let mut p0 = 0;
    while p0 < b.k {
        let p1 = (p0 + KC).min(b.k);
        let kc = p1 - p0;
        let apack = &mut apack[..tiles * kc];
        a.pack(i0, rows, p0, p1, apack);
        for panel in 0..n_pad / NR {
            let (bpanel, _) = b.panel(panel, p0, p1).as_chunks::<NR>();
            for tile in 0..tiles {
                let mut acc = [[0.0f32; NR]; MR];
                for (i, row) in acc.iter_mut().enumerate() {
                    let at = (tile * MR + i) * n_pad + panel * NR;
                    if let Some(src) = c.get(at..at + NR) {
                        row.copy_from_slice(src);
                    }
                }
                kernel(&apack[tile * kc..(tile + 1) * kc], bpanel, &mut acc);
                for (i, row) in acc.iter().enumerate() {
                    let at = (tile * MR + i) * n_pad + panel * NR;
                    if let Some(dst) = c.get_mut(at..at + NR) {
                        dst.copy_from_slice(row);
                    }
                }
            }
        }
        p0 = p1;
    }
}

/// `C = A B` for `C`'s rows, written through `epilogue`: `out` holds one `out_row_bytes` row per
/// row of `C`; it is cut into chunks of [`MC`] rows, and for each, `epilogue(first_row, c,
/// n_pad, out_chunk)` gets that chunk's `C` rows (f32, row stride `n_pad`) and its bytes.
pub(crate) fn gemm<F>(a: ASource<'_>, b: &PackedB, out: &mut [u8], out_row_bytes: usize, threads: usize, epilogue: F)
where
    F: Fn(usize, &[f32], usize, &mut [u8]) + Sync,
{
    if out_row_bytes == 0 {
        return;
    }
    let n_pad = b.padded_n();
    parallel::for_each_chunk(out, MC * out_row_bytes, threads, |index, chunk| {
        let rows = chunk.len() / out_row_bytes;
        let i0 = index * MC;
        let mut c = vec![0.0f32; rows.div_ceil(MR) * MR * n_pad];
        block(&a, b, i0, rows, &mut c);
        epilogue(i0, &c, n_pad, chunk);
    });
}
