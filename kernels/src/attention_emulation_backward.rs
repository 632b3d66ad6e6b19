//! The emulation of the backward kernels (`memo_attention_backward_dkdv<D>` and
//! `memo_attention_backward_dq<D>`), transcribed like the forward in the parent module.

// The loops index like the kernels do (the point of the emulation), not with iterators.
#![allow(clippy::needless_range_loop)]

use super::{
    acc, at, grid, inv_freq, load, mma_abt, mma_px, row_stats, store_pair, stream_tiles, tiles, Acc, Backward, Path,
    Shape, LANES, OWNER, WARPS,
};

/// The backward's inputs (bf16 bits; `lse` f32).
pub(in crate::attention) struct Inputs<'a> {
    pub(in crate::attention) q: &'a [u16],
    pub(in crate::attention) k: &'a [u16],
    pub(in crate::attention) v: &'a [u16],
    pub(in crate::attention) out: &'a [u16],
    pub(in crate::attention) lse: &'a [f32],
    pub(in crate::attention) dout: &'a [u16],
}

/// Both backward kernels over their whole grids.
pub(in crate::attention) fn backward(sh: &Shape, x: &Inputs<'_>, path: Path) -> Backward {
    // dk, dv are written whole by the kernel (zeros for unused K/V heads): start from garbage.
    let mut result = Backward { dq: vec![0; x.q.len()], dk: vec![0xffff; x.k.len()], dv: vec![0xffff; x.k.len()] };
    dkdv(sh, x, path, &mut result.dk, &mut result.dv);
    dq(sh, x, path, &mut result.dq);
    result
}

/// `memo_attention_backward_dkdv<D>`: one block per key tile of a K/V head, looping over the
/// launch's query heads that use it.
fn dkdv(sh: &Shape, x: &Inputs<'_>, path: Path, dk: &mut [u16], dv: &mut [u16]) {
    let (d, s) = (sh.d, sh.s);
    let (_, n) = tiles(d);
    let ld = d + 8;
    let scale = sh.scale();
    let inv_freq = inv_freq(d, sh.theta);
    let inv = Some(inv_freq.as_slice());
    let grid_x = s.div_ceil(OWNER);
    let (row_elems, kv_row_elems) = (sh.row(), sh.kv_row());
    for (seq, kv, block_x) in grid(sh.kv_heads, sh.sequences, grid_x) {
        let k0 = block_x * OWNER;
        let (kv_first, kv_end) = (kv * sh.group, (kv + 1) * sh.group);
        let h_begin = kv_first.saturating_sub(sh.first_query);
        let h_end = kv_end.saturating_sub(sh.first_query).min(sh.heads);
        let (mut k_s, mut v_s) = (vec![0u16; OWNER * ld], vec![0u16; OWNER * ld]);
        let (mut q_s, mut do_s) = (vec![0u16; n * ld], vec![0u16; n * ld]);
        let (mut lse_s, mut delta_s) = (vec![0.0f32; n], vec![0.0f32; n]);
        load(&mut k_s, x.k, sh, seq, kv, kv_row_elems, k0, OWNER, inv);
        load(&mut v_s, x.v, sh, seq, kv, kv_row_elems, k0, OWNER, None);
        // Tensor path: [warp] of per-lane accumulators; scalar path: [thread] of halves.
        let mut dk_t: Vec<Acc> = (0..WARPS).map(|_| acc(d / 8)).collect();
        let mut dv_t: Vec<Acc> = (0..WARPS).map(|_| acc(d / 8)).collect();
        let mut dk_s = vec![vec![0.0f32; d / 2]; 2 * OWNER];
        let mut dv_s = vec![vec![0.0f32; d / 2]; 2 * OWNER];
        let mut staged = None;
        for head in h_begin..h_end {
            let mut i0 = k0;
            while i0 < s {
                // The next tile: this head's next query tile, or the next head's first (k0 < s).
                let next = if i0 + n < s { Some((head, i0 + n)) } else { (head + 1 < h_end).then_some((head + 1, k0)) };
                let src_at = (seq, head, row_elems);
                stream_tiles(path, &mut staged, (&mut q_s, x.q, inv), (&mut do_s, x.dout), sh, src_at, i0, n, next);
                row_stats(path, &mut lse_s, &mut delta_s, &do_s, x.out, x.lse, sh, seq, head, i0, n);
                if path.tensor() {
                    let visible = path == Path::Pipelined && i0 + 1 >= k0 + OWNER && i0 + n <= s;
                    for warp in 0..WARPS {
                        let mut p = mma_abt(d, n / 8, &k_s[warp * 16 * ld..], &q_s);
                        let mut ds = mma_abt(d, n / 8, &v_s[warp * 16 * ld..], &do_s);
                        for lane in 0..LANES {
                            let (g, t) = (lane / 4, lane % 4);
                            let key0 = k0 + warp * 16 + g;
                            let key1 = key0 + 8;
                            for nn in 0..n / 8 {
                                for e in 0..4 {
                                    let i = nn * 8 + 2 * t + (e & 1);
                                    let qpos = i0 + i;
                                    let kpos = if e < 2 { key0 } else { key1 };
                                    let live = visible || (kpos <= qpos && qpos < s);
                                    let pij = if live { (p[lane][nn][e] * scale - lse_s[i]).exp() } else { 0.0 };
                                    p[lane][nn][e] = pij;
                                    ds[lane][nn][e] = pij * (ds[lane][nn][e] - delta_s[i]);
                                }
                            }
                        }
                        mma_px(d, n / 8, &mut dv_t[warp], &p, &do_s);
                        mma_px(d, n / 8, &mut dk_t[warp], &ds, &q_s);
                    }
                } else {
                    for thread in 0..2 * OWNER {
                        let (r, half) = (thread >> 1, thread & 1);
                        let c0 = half * (d / 2);
                        let key = k0 + r;
                        for i in 0..n {
                            let qpos = i0 + i;
                            if key <= qpos && qpos < s {
                                let (mut dot, mut dp) = (0.0f32, 0.0f32);
                                for c in 0..d {
                                    dot += at(&q_s, i * ld + c) * at(&k_s, r * ld + c);
                                    dp += at(&do_s, i * ld + c) * at(&v_s, r * ld + c);
                                }
                                let pij = (dot * scale - lse_s[i]).exp();
                                let dsij = pij * (dp - delta_s[i]);
                                for c in 0..d / 2 {
                                    dv_s[thread][c] += pij * at(&do_s, i * ld + c0 + c);
                                    dk_s[thread][c] += dsij * at(&q_s, i * ld + c0 + c);
                                }
                            }
                        }
                    }
                }
                i0 += n;
            }
        }
        // dk of an unused K/V head: +0.0, not rotated.
        let dk_rope = if h_begin < h_end { inv } else { None };
        let dst = (seq, kv, kv_row_elems);
        if path.tensor() {
            for warp in 0..WARPS {
                for lane in 0..LANES {
                    let (g, t) = (lane / 4, lane % 4);
                    let key0 = k0 + warp * 16 + g;
                    let key1 = key0 + 8;
                    for nn in 0..d / 8 {
                        let pair = nn * 4 + t;
                        let (dkt, dvt) = (dk_t[warp][lane][nn], dv_t[warp][lane][nn]);
                        if key0 < s {
                            store_pair(dk, sh, dst, key0, pair, dkt[0] * scale, dkt[1] * scale, dk_rope);
                            store_pair(dv, sh, dst, key0, pair, dvt[0], dvt[1], None);
                        }
                        if key1 < s {
                            store_pair(dk, sh, dst, key1, pair, dkt[2] * scale, dkt[3] * scale, dk_rope);
                            store_pair(dv, sh, dst, key1, pair, dvt[2], dvt[3], None);
                        }
                    }
                }
            }
        } else {
            for thread in 0..2 * OWNER {
                let (r, half) = (thread >> 1, thread & 1);
                let c0 = half * (d / 2);
                let key = k0 + r;
                if key < s {
                    for c in (0..d / 2).step_by(2) {
                        let pair = (c0 + c) / 2;
                        let (a, b) = (&dk_s[thread], &dv_s[thread]);
                        store_pair(dk, sh, dst, key, pair, a[c] * scale, a[c + 1] * scale, dk_rope);
                        store_pair(dv, sh, dst, key, pair, b[c], b[c + 1], None);
                    }
                }
            }
        }
    }
}

/// `memo_attention_backward_dq<D>`.
fn dq(sh: &Shape, x: &Inputs<'_>, path: Path, dq: &mut [u16]) {
    let (d, s) = (sh.d, sh.s);
    let (_, n) = tiles(d);
    let ld = d + 8;
    let scale = sh.scale();
    let inv_freq = inv_freq(d, sh.theta);
    let inv = Some(inv_freq.as_slice());
    let grid_x = s.div_ceil(OWNER);
    for (seq, head, block_x) in grid(sh.heads, sh.sequences, grid_x) {
        let q0 = (grid_x - 1 - block_x) * OWNER;
        let q_last = (q0 + OWNER - 1).min(s - 1);
        let (kv, row_elems, kv_row_elems) = (sh.kv_head(head), sh.row(), sh.kv_row());
        let (mut q_s, mut do_s) = (vec![0u16; OWNER * ld], vec![0u16; OWNER * ld]);
        let (mut k_s, mut v_s) = (vec![0u16; n * ld], vec![0u16; n * ld]);
        let (mut lse_s, mut delta_s) = (vec![0.0f32; OWNER], vec![0.0f32; OWNER]);
        load(&mut q_s, x.q, sh, seq, head, row_elems, q0, OWNER, inv);
        load(&mut do_s, x.dout, sh, seq, head, row_elems, q0, OWNER, None);
        row_stats(path, &mut lse_s, &mut delta_s, &do_s, x.out, x.lse, sh, seq, head, q0, OWNER);
        let mut dq_t: Vec<Acc> = (0..WARPS).map(|_| acc(d / 8)).collect();
        let mut dq_s = vec![vec![0.0f32; d / 2]; 2 * OWNER];
        let mut k0 = 0;
        let mut staged = None;
        while k0 <= q_last {
            let next = (k0 + n <= q_last).then_some((kv, k0 + n));
            let src_at = (seq, kv, kv_row_elems);
            stream_tiles(path, &mut staged, (&mut k_s, x.k, inv), (&mut v_s, x.v), sh, src_at, k0, n, next);
            if path.tensor() {
                let visible = path == Path::Pipelined && k0 + n <= q0 + 1 && q0 + OWNER <= s;
                for warp in 0..WARPS {
                    let p = mma_abt(d, n / 8, &q_s[warp * 16 * ld..], &k_s);
                    let mut ds = mma_abt(d, n / 8, &do_s[warp * 16 * ld..], &v_s);
                    for lane in 0..LANES {
                        let (g, t) = (lane / 4, lane % 4);
                        let row0 = warp * 16 + g;
                        let row1 = row0 + 8;
                        let (pos0, pos1) = (q0 + row0, q0 + row1);
                        let lse_r = [lse_s[row0], lse_s[row1]];
                        let delta_r = [delta_s[row0], delta_s[row1]];
                        for nn in 0..n / 8 {
                            for e in 0..4 {
                                let key = k0 + nn * 8 + 2 * t + (e & 1);
                                let qpos = if e < 2 { pos0 } else { pos1 };
                                let live = visible || (key <= qpos && qpos < s);
                                let pij = if live { (p[lane][nn][e] * scale - lse_r[e >> 1]).exp() } else { 0.0 };
                                ds[lane][nn][e] = pij * (ds[lane][nn][e] - delta_r[e >> 1]);
                            }
                        }
                    }
                    mma_px(d, n / 8, &mut dq_t[warp], &ds, &k_s);
                }
            } else {
                for thread in 0..2 * OWNER {
                    let (r, half) = (thread >> 1, thread & 1);
                    let c0 = half * (d / 2);
                    let pos = q0 + r;
                    let (lse_r, delta_r) = (lse_s[r], delta_s[r]);
                    for j in 0..n {
                        let key = k0 + j;
                        if key <= pos && pos < s {
                            let (mut dot, mut dp) = (0.0f32, 0.0f32);
                            for c in 0..d {
                                dot += at(&q_s, r * ld + c) * at(&k_s, j * ld + c);
                                dp += at(&do_s, r * ld + c) * at(&v_s, j * ld + c);
                            }
                            let pij = (dot * scale - lse_r).exp();
                            let dsij = pij * (dp - delta_r);
                            for c in 0..d / 2 {
                                dq_s[thread][c] += dsij * at(&k_s, j * ld + c0 + c);
                            }
                        }
                    }
                }
            }
            k0 += n;
        }
        if path.tensor() {
            for warp in 0..WARPS {
                for lane in 0..LANES {
                    let (g, t) = (lane / 4, lane % 4);
                    let pos0 = q0 + warp * 16 + g;
                    let pos1 = pos0 + 8;
                    for nn in 0..d / 8 {
                        let pair = nn * 4 + t;
                        let a = dq_t[warp][lane][nn];
                        if pos0 < s {
                            store_pair(dq, sh, (seq, head, row_elems), pos0, pair, a[0] * scale, a[1] * scale, inv);
                        }
                        if pos1 < s {
                            store_pair(dq, sh, (seq, head, row_elems), pos1, pair, a[2] * scale, a[3] * scale, inv);
                        }
                    }
                }
            }
        } else {
            for thread in 0..2 * OWNER {
                let (r, half) = (thread >> 1, thread & 1);
                let c0 = half * (d / 2);
                let pos = q0 + r;
                if pos < s {
                    let a = &dq_s[thread];
                    for c in (0..d / 2).step_by(2) {
                        store_pair(
                            dq,
                            sh,
                            (seq, head, row_elems),
                            pos,
                            (c0 + c) / 2,
                            a[c] * scale,
                            a[c + 1] * scale,
                            inv,
                        );
                    }
                }
            }
        }
    }
}
