//! A CPU emulation of `kernels/attention.cu`, compared with `runtime-cpu`'s attention: the one
//! way to test the kernels' tiling, masking, online softmax, backward decomposition and index
//! arithmetic without a GPU.
//!
//! Each function transcribes a kernel of the source line by line (same names, same index
//! expressions, same tile sizes): blocks run one after another, and in the tensor path each warp's
//! 32 lanes keep their own registers. `mma` is the hardware model: it gathers A and B from the
//! lanes' registers by the PTX ISA's m16n8k16 layout, multiplies in f32 and scatters C back by the
//! same layout, checking that the layout covers every element exactly once. `ldmatrix_x4` models
//! the pipelined variant's fragment loads the same way (from the PTX ISA's description), and
//! every fragment it gives is checked against the word loads. What this cannot catch: a wrong
//! reading of those layouts (the model and the kernel would agree), races between threads, the
//! timing of the pipelined variant's staging (emulated in order), and the compilers' behaviour.

// The loops index like the kernels do (the point of the emulation), not with iterators.
#![allow(clippy::needless_range_loop)]

use std::f64::consts::TAU;

use super::OWNER_ROWS;

/// `MEMO_ATTN_OWNER`.
const OWNER: usize = OWNER_ROWS as usize;
/// `MEMO_ATTN_THREADS`.
const THREADS: usize = super::THREADS as usize;
/// Warps of 32 lanes per block in the tensor path (`MEMO_ATTN_THREADS / 32`).
const WARPS: usize = THREADS / LANES;
const LANES: usize = 32;

/// `MemoAttnTiles<D>::{FORWARD, BACKWARD}`.
pub(super) fn tiles(d: usize) -> (usize, usize) {
    if d == 128 {
        (32, 16)
    } else {
        (64, 64)
    }
}

/// Which of the source's compile-time paths the emulation transcribes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Path {
    /// `MEMO_ATTN_TENSOR` 0 (HIP, or CUDA with `MEMO_ATTN_SCALAR`).
    Scalar,
    /// The tensor path, baseline variant.
    Tensor,
    /// The tensor path, `MEMO_ATTN_PIPELINED`: streamed tiles staged through registers one
    /// iteration ahead (`memo_attn_fetch`, `memo_attn_commit`). Its ldmatrix fragments are checked
    /// against the baseline's word loads by every `mma_abt`/`mma_px`, whichever path runs.
    Pipelined,
}

impl Path {
    pub(super) const ALL: [Path; 3] = [Path::Scalar, Path::Tensor, Path::Pipelined];

    pub(super) fn tensor(self) -> bool {
        self != Path::Scalar
    }
}

/// The launch's shapes (the kernels' `s`, `heads`, `kv_heads`, `group`, `first_query`, D and
/// gridDim.z) and RoPE's base (their `theta_bits`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Shape {
    pub(super) s: usize,
    pub(super) heads: usize,
    pub(super) kv_heads: usize,
    pub(super) group: usize,
    pub(super) first_query: usize,
    pub(super) d: usize,
    pub(super) sequences: usize,
    pub(super) theta: f64,
}

impl Shape {
    /// `memo_attn_elem`: element (seq, pos, head, 0) of a tensor of `row_elems` bf16 per row.
    fn elem(&self, seq: usize, pos: usize, row_elems: usize, head: usize) -> usize {
        (seq * self.s + pos) * row_elems + head * self.d
    }

    /// The kernels' `row_elems`: a row of q, out, dout, dq.
    fn row(&self) -> usize {
        self.heads * self.d
    }

    /// The kernels' `kv_row_elems`: a row of k, v, dk, dv.
    fn kv_row(&self) -> usize {
        self.kv_heads * self.d
    }

    /// `memo_attn_kv_head`.
    fn kv_head(&self, head: usize) -> usize {
        (self.first_query + head) / self.group
    }

    /// `memo_attn_lse_index`.
    fn lse_index(&self, seq: usize, pos: usize, head: usize) -> usize {
        (seq * self.s + pos) * self.heads + head
    }

    fn scale(&self) -> f32 {
        1.0 / (self.d as f32).sqrt()
    }
}

pub(super) fn bf16_to_f32(x: u16) -> f32 {
    f32::from_bits(u32::from(x) << 16)
}

/// `memo_f32_to_bf16`.
pub(super) fn f32_to_bf16(f: f32) -> u16 {
    let bits = f.to_bits();
    if bits & 0x7fff_ffff > 0x7f80_0000 {
        return ((bits >> 16) | 0x0040) as u16;
    }
    (bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16) as u16
}

fn pack(lo: f32, hi: f32) -> u32 {
    u32::from(f32_to_bf16(lo)) | (u32::from(f32_to_bf16(hi)) << 16)
}

fn lo(bits: u32) -> f32 {
    bf16_to_f32((bits & 0xffff) as u16)
}

fn hi(bits: u32) -> f32 {
    bf16_to_f32((bits >> 16) as u16)
}

/// A 32-bit load of two bf16 (little-endian).
fn word(x: &[u16], i: usize) -> u32 {
    u32::from(x[i]) | (u32::from(x[i + 1]) << 16)
}

fn store_word(x: &mut [u16], i: usize, bits: u32) {
    x[i] = (bits & 0xffff) as u16;
    x[i + 1] = (bits >> 16) as u16;
}

/// `memo_attn_inv_freq`: `theta^(-2i/D)` in f64.
pub(super) fn inv_freq(d: usize, theta: f64) -> Vec<f64> {
    (0..d / 2).map(|i| theta.powf(-2.0 * i as f64 / d as f64)).collect()
}

/// `memo_rope_cos_sin` (memo_gpu.h): (cos, sin).
pub(super) fn rope(pos: usize, inv_freq: f64) -> (f32, f32) {
    let two_pi_hi = TAU; // 6.283185307179586 in the source
    let two_pi_lo = 2.4492935982947064e-16f64;
    let angle = pos as f64 * inv_freq;
    let turns = (angle * (1.0 / TAU)).round_ties_even();
    let mut reduced = (-turns).mul_add(two_pi_hi, angle);
    reduced = (-turns).mul_add(two_pi_lo, reduced);
    let (sn, c) = (reduced as f32).sin_cos();
    (c, sn)
}

/// `MemoAttnRows`: one thread's rows in a tile load and its RoPE rotation.
struct Rows {
    pair: usize,
    row0: usize,
    step: usize,
    c: f32,
    sn: f32,
    step_c: f32,
    step_s: f32,
}

impl Rows {
    fn new(thread: usize, d: usize, first_pos: usize, inv_freq: Option<&[f64]>) -> Rows {
        let pairs = d / 2;
        let step = THREADS / pairs;
        assert_eq!(THREADS % pairs, 0);
        let (pair, row0) = (thread % pairs, thread / pairs);
        let (mut c, mut sn, mut step_c, mut step_s) = (1.0f32, 0.0f32, 1.0f32, 0.0f32);
        if let Some(inv_freq) = inv_freq {
            (c, sn) = rope(first_pos + row0, inv_freq[pair]);
            (step_c, step_s) = rope(step, inv_freq[pair]);
        }
        Rows { pair, row0, step, c, sn, step_c, step_s }
    }

    /// `MemoAttnRows::put`.
    fn put(&mut self, dst: &mut [u16], ld: usize, row: usize, present: bool, bits: u32, rotate: bool) {
        let (mut x0, mut x1) = (0.0f32, 0.0f32);
        if present {
            x0 = lo(bits);
            x1 = hi(bits);
            if rotate {
                let y0 = x0 * self.c - x1 * self.sn;
                let y1 = x0 * self.sn + x1 * self.c;
                x0 = y0;
                x1 = y1;
            }
        }
        store_word(dst, row * ld + 2 * self.pair, pack(x0, x1));
        let next_c = self.c * self.step_c - self.sn * self.step_s;
        self.sn = self.sn * self.step_c + self.c * self.step_s;
        self.c = next_c;
    }
}

/// `memo_attn_load`.
#[allow(clippy::too_many_arguments)]
fn load(
    dst: &mut [u16],
    src: &[u16],
    sh: &Shape,
    seq: usize,
    head: usize,
    row_elems: usize,
    first_pos: usize,
    rows: usize,
    inv_freq: Option<&[f64]>,
) {
    for thread in 0..THREADS {
        let mut at = Rows::new(thread, sh.d, first_pos, inv_freq);
        let mut row = at.row0;
        while row < rows {
            let pos = first_pos + row;
            let bits = if pos < sh.s { word(src, sh.elem(seq, pos, row_elems, head) + 2 * at.pair) } else { 0 };
            at.put(dst, sh.d + 8, row, pos < sh.s, bits, inv_freq.is_some());
            row += at.step;
        }
    }
}

/// `MemoAttnStage`: `[thread][i]`, the word of pair `thread % (d/2)` of row
/// `thread / (d/2) + i STEP`.
pub(super) type Stage = Vec<Vec<u32>>;

/// `memo_attn_fetch`.
fn fetch(
    src: &[u16],
    sh: &Shape,
    (seq, head, row_elems): (usize, usize, usize),
    first_pos: usize,
    rows: usize,
) -> Stage {
    let pairs = sh.d / 2;
    let step = THREADS / pairs;
    assert_eq!(rows % step, 0, "every thread stages the same number of rows");
    (0..THREADS)
        .map(|thread| {
            let (pair, row0) = (thread % pairs, thread / pairs);
            (0..rows / step)
                .map(|i| {
                    let pos = first_pos + row0 + i * step;
                    if pos < sh.s {
                        word(src, sh.elem(seq, pos, row_elems, head) + 2 * pair)
                    } else {
                        0
                    }
                })
                .collect()
        })
        .collect()
}

/// `memo_attn_commit`.
fn commit(dst: &mut [u16], stage: &Stage, sh: &Shape, first_pos: usize, inv_freq: Option<&[f64]>) {
    for (thread, words) in stage.iter().enumerate() {
        let mut at = Rows::new(thread, sh.d, first_pos, inv_freq);
        for (i, &bits) in words.iter().enumerate() {
            let row = at.row0 + i * at.step;
            at.put(dst, sh.d + 8, row, first_pos + row < sh.s, bits, inv_freq.is_some());
        }
    }
}

/// Two streamed tiles (`a` rotated by `a_rope`, `b` not) of head `head` (rows of `row_elems`),
/// `rows` rows from `first_pos` on, as one loop iteration of a kernel stages them:
/// `memo_attn_load` in the baseline paths; in the pipelined path, `memo_attn_commit` of the words
/// fetched one iteration earlier (`staged`, fetched on the first call), then `memo_attn_fetch` of
/// the next iteration's `(head, first_pos)` when there is one.
#[allow(clippy::too_many_arguments)]
pub(super) fn stream_tiles(
    path: Path,
    staged: &mut Option<(Stage, Stage)>,
    (a_s, a, a_rope): (&mut [u16], &[u16], Option<&[f64]>),
    (b_s, b): (&mut [u16], &[u16]),
    sh: &Shape,
    (seq, head, row_elems): (usize, usize, usize),
    first_pos: usize,
    rows: usize,
    next: Option<(usize, usize)>,
) {
    if path != Path::Pipelined {
        load(a_s, a, sh, seq, head, row_elems, first_pos, rows, a_rope);
        load(b_s, b, sh, seq, head, row_elems, first_pos, rows, None);
        return;
    }
    let src_at = (seq, head, row_elems);
    let (a_words, b_words) =
        staged.take().unwrap_or_else(|| (fetch(a, sh, src_at, first_pos, rows), fetch(b, sh, src_at, first_pos, rows)));
    commit(a_s, &a_words, sh, first_pos, a_rope);
    commit(b_s, &b_words, sh, first_pos, None);
    *staged = next.map(|(next_head, next_pos)| {
        let src_at = (seq, next_head, row_elems);
        (fetch(a, sh, src_at, next_pos, rows), fetch(b, sh, src_at, next_pos, rows))
    });
}

/// `memo_attn_row_stats`: in the pipelined path `THREADS / rows` lanes share a row, each sums
/// its share of the pairs in order, and a butterfly adds the shares.
#[allow(clippy::too_many_arguments)]
pub(super) fn row_stats(
    path: Path,
    lse_s: &mut [f32],
    delta_s: &mut [f32],
    dout_s: &[u16],
    out: &[u16],
    lse: &[f32],
    sh: &Shape,
    seq: usize,
    head: usize,
    first_pos: usize,
    rows: usize,
) {
    let ld = sh.d + 8;
    let lanes = if path == Path::Pipelined { THREADS / rows } else { 1 };
    let share = sh.d / 2 / lanes;
    assert!(lanes.is_power_of_two() && lanes <= LANES && share * lanes == sh.d / 2);
    for row in 0..rows {
        let pos = first_pos + row;
        let (mut l, mut parts) = (0.0f32, vec![0.0f32; lanes]);
        if pos < sh.s {
            l = lse[sh.lse_index(seq, pos, head)];
            let o = sh.elem(seq, pos, sh.row(), head);
            for (part, delta) in parts.iter_mut().enumerate() {
                for i in 0..share {
                    let c = 2 * (part * share + i);
                    let ob = word(out, o + c);
                    let db = word(dout_s, row * ld + c);
                    *delta += lo(db) * lo(ob);
                    *delta += hi(db) * hi(ob);
                }
            }
        }
        let mut mask = 1;
        while mask < lanes {
            parts = (0..lanes).map(|lane| parts[lane] + parts[lane ^ mask]).collect();
            mask <<= 1;
        }
        lse_s[row] = l;
        delta_s[row] = parts[0];
    }
}

/// `memo_attn_store_pair`.
#[allow(clippy::too_many_arguments)]
fn store_pair(
    dst: &mut [u16],
    sh: &Shape,
    (seq, head, row_elems): (usize, usize, usize),
    pos: usize,
    pair: usize,
    mut x0: f32,
    mut x1: f32,
    inv_freq: Option<&[f64]>,
) {
    if let Some(inv_freq) = inv_freq {
        let (c, sn) = rope(pos, inv_freq[pair]);
        let y0 = x0 * c + x1 * sn;
        let y1 = x1 * c - x0 * sn;
        x0 = y0;
        x1 = y1;
    }
    store_word(dst, sh.elem(seq, pos, row_elems, head) + 2 * pair, pack(x0, x1));
}

fn at(tile: &[u16], i: usize) -> f32 {
    bf16_to_f32(tile[i])
}

// ---------------------------------------------------------------------------------------------
// The tensor path's warp model.

/// One warp's accumulators: `[lane][tile][c0..c3]`.
type Acc = Vec<Vec<[f32; 4]>>;

fn acc(tiles: usize) -> Acc {
    vec![vec![[0.0f32; 4]; tiles]; LANES]
}

/// The hardware: `c[lane][n] += A B` with A (16 x 16) and B (16 x 8) held by the lanes as the PTX
/// ISA lays out mma.m16n8k16's fragments.
fn mma(c: &mut Acc, n: usize, a: &[[u32; 4]; LANES], b: &[[u32; 2]; LANES]) {
    let mut am = [[f32::NAN; 16]; 16];
    let mut bm = [[f32::NAN; 8]; 16];
    let put = |slot: &mut f32, value: f32| {
        assert!(slot.is_nan(), "the fragment layout sets an element twice");
        *slot = value;
    };
    for lane in 0..LANES {
        let (g, t) = (lane / 4, lane % 4);
        let [a0, a1, a2, a3] = a[lane];
        put(&mut am[g][2 * t], lo(a0));
        put(&mut am[g][2 * t + 1], hi(a0));
        put(&mut am[g + 8][2 * t], lo(a1));
        put(&mut am[g + 8][2 * t + 1], hi(a1));
        put(&mut am[g][2 * t + 8], lo(a2));
        put(&mut am[g][2 * t + 9], hi(a2));
        put(&mut am[g + 8][2 * t + 8], lo(a3));
        put(&mut am[g + 8][2 * t + 9], hi(a3));
        let [b0, b1] = b[lane];
        put(&mut bm[2 * t][g], lo(b0));
        put(&mut bm[2 * t + 1][g], hi(b0));
        put(&mut bm[2 * t + 8][g], lo(b1));
        put(&mut bm[2 * t + 9][g], hi(b1));
    }
    assert!(am.iter().flatten().chain(bm.iter().flatten()).all(|x| !x.is_nan()), "an element is never set");
    let dot = |row: usize, col: usize| (0..16).map(|k| am[row][k] * bm[k][col]).sum::<f32>();
    for (lane, tiles) in c.iter_mut().enumerate() {
        let (g, t) = (lane / 4, lane % 4);
        let tile = &mut tiles[n];
        tile[0] += dot(g, 2 * t);
        tile[1] += dot(g, 2 * t + 1);
        tile[2] += dot(g + 8, 2 * t);
        tile[3] += dot(g + 8, 2 * t + 1);
    }
}

/// `ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16` (PTX ISA): lane `l` gives the element
/// index of row `l % 8` of 8 x 8 matrix `l / 8`; register `j` of lane (g, t) receives matrix
/// `j`'s elements [g][2t], [g][2t+1], or with `trans` [2t][g], [2t+1][g] (low half first).
fn ldmatrix_x4(x: &[u16], row_starts: &[usize; LANES], trans: bool) -> [[u32; 4]; LANES] {
    let at = |matrix: usize, row: usize, col: usize| x[row_starts[8 * matrix + row] + col];
    let join = |lo: u16, hi: u16| u32::from(lo) | (u32::from(hi) << 16);
    std::array::from_fn(|lane| {
        let (g, t) = (lane / 4, lane % 4);
        std::array::from_fn(|j| {
            if trans {
                join(at(j, 2 * t, g), at(j, 2 * t + 1, g))
            } else {
                join(at(j, g, 2 * t), at(j, g, 2 * t + 1))
            }
        })
    })
}

/// The pipelined variant's `memo_frag_a`: one ldmatrix.x4 from the lanes' row addresses.
fn frag_a_ldmatrix(rows: &[u16], ld: usize, k0: usize) -> [[u32; 4]; LANES] {
    ldmatrix_x4(rows, &std::array::from_fn(|lane| ((lane & 7) + (lane & 8)) * ld + k0 + ((lane >> 4) << 3)), false)
}

/// The pipelined variant's `memo_frag_b_t2`: n-tiles n0 (registers 0, 1) and n0 + 8 (2, 3).
fn frag_b_t2_ldmatrix(x: &[u16], ld: usize, n0: usize, k0: usize) -> [[u32; 4]; LANES] {
    ldmatrix_x4(x, &std::array::from_fn(|lane| (n0 + (lane & 7) + ((lane >> 4) << 3)) * ld + k0 + (lane & 8)), false)
}

/// The pipelined variant's `memo_frag_b2`: n-tiles n0 (registers 0, 1) and n0 + 8 (2, 3).
fn frag_b2_ldmatrix(x: &[u16], ld: usize, k0: usize, n0: usize) -> [[u32; 4]; LANES] {
    ldmatrix_x4(x, &std::array::from_fn(|lane| (k0 + (lane & 7) + (lane & 8)) * ld + n0 + ((lane >> 4) << 3)), true)
}

/// Panics unless the ldmatrix registers of two n-tiles equal the word fragments `b` of the
/// tiles `n` and `n + 1`.
fn assert_same_b(ldmatrix: &[[u32; 4]; LANES], b: &[[[u32; 2]; LANES]; 2], what: &str) {
    for lane in 0..LANES {
        let words = [b[0][lane][0], b[0][lane][1], b[1][lane][0], b[1][lane][1]];
        assert_eq!(ldmatrix[lane], words, "{what}: the ldmatrix and word fragments differ at lane {lane}");
    }
}

/// `memo_frag_a`.
fn frag_a(rows: &[u16], ld: usize, k0: usize, g: usize, t: usize) -> [u32; 4] {
    [
        word(rows, g * ld + k0 + 2 * t),
        word(rows, (g + 8) * ld + k0 + 2 * t),
        word(rows, g * ld + k0 + 2 * t + 8),
        word(rows, (g + 8) * ld + k0 + 2 * t + 8),
    ]
}

/// `memo_frag_b_t`.
fn frag_b_t(x: &[u16], ld: usize, n0: usize, k0: usize, g: usize, t: usize) -> [u32; 2] {
    [word(x, (n0 + g) * ld + k0 + 2 * t), word(x, (n0 + g) * ld + k0 + 2 * t + 8)]
}

/// `memo_frag_b`.
fn frag_b(x: &[u16], ld: usize, k0: usize, n0: usize, g: usize, t: usize) -> [u32; 2] {
    let join = |lo: u16, hi: u16| u32::from(lo) | (u32::from(hi) << 16);
    [
        join(x[(k0 + 2 * t) * ld + n0 + g], x[(k0 + 2 * t + 1) * ld + n0 + g]),
        join(x[(k0 + 2 * t + 8) * ld + n0 + g], x[(k0 + 2 * t + 9) * ld + n0 + g]),
    ]
}

/// `memo_frag_a_acc`.
fn frag_a_acc(x: &[[f32; 4]], kk: usize) -> [u32; 4] {
    [
        pack(x[2 * kk][0], x[2 * kk][1]),
        pack(x[2 * kk][2], x[2 * kk][3]),
        pack(x[2 * kk + 1][0], x[2 * kk + 1][1]),
        pack(x[2 * kk + 1][2], x[2 * kk + 1][3]),
    ]
}

/// `memo_mma_abt` (B fragments two n-tiles at a time), checking on the way that the pipelined
/// variant's ldmatrix fragments are the word fragments.
fn mma_abt(d: usize, nt: usize, a_rows: &[u16], b_rows: &[u16]) -> Acc {
    let ld = d + 8;
    assert_eq!(nt % 2, 0, "B fragments come two n-tiles at a time");
    let mut out = acc(nt);
    for kk in 0..d / 16 {
        let a: [[u32; 4]; LANES] = std::array::from_fn(|lane| frag_a(a_rows, ld, kk * 16, lane / 4, lane % 4));
        assert_eq!(frag_a_ldmatrix(a_rows, ld, kk * 16), a, "A fragments of k-step {kk} differ");
        for n in (0..nt).step_by(2) {
            let b: [[[u32; 2]; LANES]; 2] = std::array::from_fn(|i| {
                std::array::from_fn(|lane| frag_b_t(b_rows, ld, (n + i) * 8, kk * 16, lane / 4, lane % 4))
            });
            assert_same_b(&frag_b_t2_ldmatrix(b_rows, ld, n * 8, kk * 16), &b, "Q K^T");
            mma(&mut out, n, &a, &b[0]);
            mma(&mut out, n + 1, &a, &b[1]);
        }
    }
    out
}

/// `memo_mma_px` (B fragments two n-tiles at a time), checking the ldmatrix fragments as
/// `mma_abt` does.
fn mma_px(d: usize, nt: usize, out: &mut Acc, p: &Acc, x: &[u16]) {
    let ld = d + 8;
    for kk in 0..nt / 2 {
        let a: [[u32; 4]; LANES] = std::array::from_fn(|lane| frag_a_acc(&p[lane], kk));
        for n in (0..d / 8).step_by(2) {
            let b: [[[u32; 2]; LANES]; 2] = std::array::from_fn(|i| {
                std::array::from_fn(|lane| frag_b(x, ld, kk * 16, (n + i) * 8, lane / 4, lane % 4))
            });
            assert_same_b(&frag_b2_ldmatrix(x, ld, kk * 16, n * 8), &b, "P X");
            mma(out, n, &a, &b[0]);
            mma(out, n + 1, &a, &b[1]);
        }
    }
}

/// `memo_shfl_xor` over a warp.
fn shfl_xor(v: &[f32; LANES], mask: usize) -> [f32; LANES] {
    std::array::from_fn(|lane| v[lane ^ mask])
}

/// `memo_quad_max` / `memo_quad_sum` on every lane.
fn quad(v: [f32; LANES], op: fn(f32, f32) -> f32) -> [f32; LANES] {
    let step1 = shfl_xor(&v, 1);
    let v: [f32; LANES] = std::array::from_fn(|lane| op(v[lane], step1[lane]));
    let step2 = shfl_xor(&v, 2);
    std::array::from_fn(|lane| op(v[lane], step2[lane]))
}

// ---------------------------------------------------------------------------------------------
// The kernels.

/// The forward's outputs (`out` bf16 bits, `lse`).
pub(super) struct Forward {
    pub(super) out: Vec<u16>,
    pub(super) lse: Vec<f32>,
}

/// The backward's outputs (bf16 bits).
pub(super) struct Backward {
    pub(super) dq: Vec<u16>,
    pub(super) dk: Vec<u16>,
    pub(super) dv: Vec<u16>,
}

/// `memo_attention_forward<D>` over the whole grid.
pub(super) fn forward(sh: &Shape, q: &[u16], k: &[u16], v: &[u16], path: Path) -> Forward {
    let (d, s) = (sh.d, sh.s);
    let (n, _) = tiles(d);
    let ld = d + 8;
    let scale = sh.scale();
    let mut result = Forward { out: vec![0; q.len()], lse: vec![0.0; sh.sequences * s * sh.heads] };
    let (out, lse) = (&mut result.out, &mut result.lse);
    let grid_x = s.div_ceil(OWNER);
    let inv_freq = inv_freq(d, sh.theta);
    let inv = Some(inv_freq.as_slice());
    for (seq, head, block_x) in grid(sh.heads, sh.sequences, grid_x) {
        let q0 = (grid_x - 1 - block_x) * OWNER;
        let q_last = (q0 + OWNER - 1).min(s - 1);
        let (kv, row_elems, kv_row_elems) = (sh.kv_head(head), sh.row(), sh.kv_row());
        let (mut q_s, mut k_s, mut v_s) = (vec![0u16; OWNER * ld], vec![0u16; n * ld], vec![0u16; n * ld]);
        load(&mut q_s, q, sh, seq, head, row_elems, q0, OWNER, inv);
        if path.tensor() {
            let mut o: Vec<Acc> = (0..WARPS).map(|_| acc(d / 8)).collect();
            let mut m = [[[f32::NEG_INFINITY; 2]; LANES]; WARPS];
            let mut l = [[[0.0f32; 2]; LANES]; WARPS];
            let mut staged = None;
            let mut k0 = 0;
            while k0 <= q_last {
                let next = (k0 + n <= q_last).then_some((kv, k0 + n));
                let src_at = (seq, kv, kv_row_elems);
                stream_tiles(path, &mut staged, (&mut k_s, k, inv), (&mut v_s, v), sh, src_at, k0, n, next);
                let visible = path == Path::Pipelined && k0 + n <= q0 + 1;
                for warp in 0..WARPS {
                    let mut sc = mma_abt(d, n / 8, &q_s[warp * 16 * ld..], &k_s);
                    let mut tile_max = [[f32::NEG_INFINITY; LANES]; 2];
                    for (lane, tiles) in sc.iter_mut().enumerate() {
                        let (g, t) = (lane / 4, lane % 4);
                        let pos0 = q0 + warp * 16 + g;
                        let pos1 = pos0 + 8;
                        for (nn, tile) in tiles.iter_mut().enumerate() {
                            for (e, value) in tile.iter_mut().enumerate() {
                                let key = k0 + nn * 8 + 2 * t + (e & 1);
                                let pos = if e < 2 { pos0 } else { pos1 };
                                let mut x = *value * scale;
                                if !visible && (key > pos || key >= s) {
                                    x = f32::NEG_INFINITY;
                                }
                                *value = x;
                                tile_max[e >> 1][lane] = tile_max[e >> 1][lane].max(x);
                            }
                        }
                    }
                    let quad_max = [quad(tile_max[0], f32::max), quad(tile_max[1], f32::max)];
                    let mut corr = [[0.0f32; 2]; LANES];
                    let mut m_new = [[0.0f32; 2]; LANES];
                    for lane in 0..LANES {
                        for r in 0..2 {
                            m_new[lane][r] = m[warp][lane][r].max(quad_max[r][lane]);
                            corr[lane][r] = (m[warp][lane][r] - m_new[lane][r]).exp();
                            m[warp][lane][r] = m_new[lane][r];
                            l[warp][lane][r] *= corr[lane][r];
                        }
                        for tile in sc[lane].iter_mut() {
                            for (e, value) in tile.iter_mut().enumerate() {
                                let p = (*value - m_new[lane][e >> 1]).exp();
                                *value = p;
                                l[warp][lane][e >> 1] += p;
                            }
                        }
                        for tile in o[warp][lane].iter_mut() {
                            tile[0] *= corr[lane][0];
                            tile[1] *= corr[lane][0];
                            tile[2] *= corr[lane][1];
                            tile[3] *= corr[lane][1];
                        }
                    }
                    mma_px(d, n / 8, &mut o[warp], &sc, &v_s);
                }
                k0 += n;
            }
            for warp in 0..WARPS {
                let sums = [0, 1].map(|r| quad(std::array::from_fn(|lane| l[warp][lane][r]), |a, b| a + b));
                for lane in 0..LANES {
                    let (g, t) = (lane / 4, lane % 4);
                    let pos0 = q0 + warp * 16 + g;
                    let pos1 = pos0 + 8;
                    let (sum0, sum1) = (sums[0][lane], sums[1][lane]);
                    for (nn, tile) in o[warp][lane].iter().enumerate() {
                        let pair = nn * 4 + t;
                        if pos0 < s {
                            store_pair(
                                out,
                                sh,
                                (seq, head, row_elems),
                                pos0,
                                pair,
                                tile[0] / sum0,
                                tile[1] / sum0,
                                None,
                            );
                        }
                        if pos1 < s {
                            store_pair(
                                out,
                                sh,
                                (seq, head, row_elems),
                                pos1,
                                pair,
                                tile[2] / sum1,
                                tile[3] / sum1,
                                None,
                            );
                        }
                    }
                    if t == 0 {
                        if pos0 < s {
                            lse[sh.lse_index(seq, pos0, head)] = m[warp][lane][0] + sum0.ln();
                        }
                        if pos1 < s {
                            lse[sh.lse_index(seq, pos1, head)] = m[warp][lane][1] + sum1.ln();
                        }
                    }
                }
            }
        } else {
            // One thread per (row, half); thread order does not matter between barriers.
            let mut acc = vec![vec![0.0f32; d / 2]; 2 * OWNER];
            let mut m = vec![f32::NEG_INFINITY; 2 * OWNER];
            let mut l = vec![0.0f32; 2 * OWNER];
            let mut k0 = 0;
            while k0 <= q_last {
                load(&mut k_s, k, sh, seq, kv, kv_row_elems, k0, n, inv);
                load(&mut v_s, v, sh, seq, kv, kv_row_elems, k0, n, None);
                for thread in 0..2 * OWNER {
                    let (r, half) = (thread >> 1, thread & 1);
                    let c0 = half * (d / 2);
                    let pos = q0 + r;
                    let mut sc = vec![0.0f32; n];
                    let mut tile_max = f32::NEG_INFINITY;
                    for (j, score) in sc.iter_mut().enumerate() {
                        let mut dot = 0.0f32;
                        for c in 0..d {
                            dot += at(&q_s, r * ld + c) * at(&k_s, j * ld + c);
                        }
                        let mut x = dot * scale;
                        let key = k0 + j;
                        if key > pos || key >= s {
                            x = f32::NEG_INFINITY;
                        }
                        *score = x;
                        tile_max = tile_max.max(x);
                    }
                    let m_new = m[thread].max(tile_max);
                    let corr = (m[thread] - m_new).exp();
                    for a in acc[thread].iter_mut() {
                        *a *= corr;
                    }
                    let mut tile_sum = 0.0f32;
                    for (j, &score) in sc.iter().enumerate() {
                        let p = (score - m_new).exp();
                        tile_sum += p;
                        for (c, a) in acc[thread].iter_mut().enumerate() {
                            *a += p * at(&v_s, j * ld + c0 + c);
                        }
                    }
                    l[thread] = l[thread] * corr + tile_sum;
                    m[thread] = m_new;
                }
                k0 += n;
            }
            for thread in 0..2 * OWNER {
                let (r, half) = (thread >> 1, thread & 1);
                let c0 = half * (d / 2);
                let pos = q0 + r;
                if pos < s {
                    let a = &acc[thread];
                    for c in (0..d / 2).step_by(2) {
                        let (x0, x1) = (a[c] / l[thread], a[c + 1] / l[thread]);
                        store_pair(out, sh, (seq, head, row_elems), pos, (c0 + c) / 2, x0, x1, None);
                    }
                    if half == 0 {
                        lse[sh.lse_index(seq, pos, head)] = m[thread] + l[thread].ln();
                    }
                }
            }
        }
    }
    result
}

/// Blocks `(seq, head, block_x)` of a grid `(grid_x, heads, sequences)`.
fn grid(heads: usize, sequences: usize, grid_x: usize) -> impl Iterator<Item = (usize, usize, usize)> {
    (0..sequences).flat_map(move |seq| (0..heads).flat_map(move |head| (0..grid_x).map(move |x| (seq, head, x))))
}

#[path = "attention_emulation_backward.rs"]
pub(super) mod backward_kernels;
pub(super) use backward_kernels::backward;
