//! Naive f64 forwards of the ops: the oracles of `forward` and the functions `gradients`
//! differentiates numerically. Written for clarity, sharing no code with the kernels.

/// `y = x W^T + bias`: `x` is `m x k`, `w` is `n x k`.
pub(super) fn linear(x: &[f64], w: &[f64], bias: &[f64], k: usize) -> Vec<f64> {
    let (m, n) = (x.len() / k.max(1), bias.len());
    let mut y = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            y[i * n + j] = bias[j] + (0..k).map(|p| x[i * k + p] * w[j * k + p]).sum::<f64>();
        }
    }
    y
}

/// Row-wise layer norm with eps 1e-5.
pub(super) fn layer_norm(x: &[f64], scale: &[f64], shift: &[f64]) -> Vec<f64> {
    layer_norm_eps(x, scale, shift, 1e-5)
}

/// Row-wise layer norm with eps `eps`.
pub(super) fn layer_norm_eps(x: &[f64], scale: &[f64], shift: &[f64], eps: f64) -> Vec<f64> {
    let h = scale.len();
    let mut y = vec![0.0; x.len()];
    for (xr, yr) in x.chunks(h).zip(y.chunks_mut(h)) {
        let mean = xr.iter().sum::<f64>() / h as f64;
        let var = xr.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / h as f64;
        let rstd = 1.0 / (var + eps).sqrt();
        for j in 0..h {
            yr[j] = (xr[j] - mean) * rstd * scale[j] + shift[j];
        }
    }
    y
}

/// Row-wise RMS norm: `x / sqrt(mean(x^2) + eps) * scale`.
pub(super) fn rms_norm(x: &[f64], scale: &[f64], eps: f64) -> Vec<f64> {
    let h = scale.len();
    let mut y = vec![0.0; x.len()];
    for (xr, yr) in x.chunks(h).zip(y.chunks_mut(h)) {
        let mean_square = xr.iter().map(|v| v * v).sum::<f64>() / h as f64;
        let rstd = 1.0 / (mean_square + eps).sqrt();
        for j in 0..h {
            yr[j] = xr[j] * rstd * scale[j];
        }
    }
    y
}

/// SwiGLU on rows `[gate | up]` of `2w`: `silu(gate) * up`, rows of `w`.
pub(super) fn swiglu(x: &[f64], w: usize) -> Vec<f64> {
    x.chunks(2 * w).flat_map(|row| (0..w).map(move |j| row[j] / (1.0 + (-row[j]).exp()) * row[w + j])).collect()
}

/// GeLU, tanh approximation.
pub(super) fn gelu(x: &[f64]) -> Vec<f64> {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    x.iter().map(|&v| 0.5 * v * (1.0 + (c * (v + 0.044715 * v * v * v)).tanh())).collect()
}

/// Rotary positions (base `theta`) applied to rows of `heads * d` (row `r` at position `r % s`).
fn rope(x: &[f64], s: usize, heads: usize, d: usize, theta: f64) -> Vec<f64> {
    let mut y = x.to_vec();
    for (r, row) in y.chunks_mut(heads * d).enumerate() {
        let pos = (r % s) as f64;
        for head in row.chunks_mut(d) {
            for i in 0..d / 2 {
                let angle = pos * theta.powf(-2.0 * i as f64 / d as f64);
                let (a, b) = (head[2 * i], head[2 * i + 1]);
                head[2 * i] = a * angle.cos() - b * angle.sin();
                head[2 * i + 1] = a * angle.sin() + b * angle.cos();
            }
        }
    }
    y
}

/// Causal attention with rotary positions and an explicit softmax: `(out, lse)`, `lse` being
/// `rows x heads`.
pub(super) fn attention(q: &[f64], k: &[f64], v: &[f64], s: usize, heads: usize, d: usize) -> (Vec<f64>, Vec<f64>) {
    attention_theta(q, k, v, s, heads, d, 10_000.0)
}

/// [`attention`] with rotary base `theta`.
pub(super) fn attention_theta(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    s: usize,
    heads: usize,
    d: usize,
    theta: f64,
) -> (Vec<f64>, Vec<f64>) {
    let width = heads * d;
    let rows = q.len() / width;
    let (q, k) = (rope(q, s, heads, d, theta), rope(k, s, heads, d, theta));
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = vec![0.0; q.len()];
    let mut lse = vec![0.0; rows * heads];
    for r in 0..rows {
        let start = r - r % s;
        for h in 0..heads {
            let at = |x: &[f64], row: usize, c: usize| x[row * width + h * d + c];
            let scores: Vec<f64> =
                (start..=r).map(|j| (0..d).map(|c| at(&q, r, c) * at(&k, j, c)).sum::<f64>() * scale).collect();
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = scores.iter().map(|x| (x - max).exp()).sum();
            lse[r * heads + h] = max + z.ln();
            for c in 0..d {
                out[r * width + h * d + c] =
                    scores.iter().zip(start..=r).map(|(x, j)| (x - max).exp() / z * at(v, j, c)).sum::<f64>();
            }
        }
    }
    (out, lse)
}

/// Grouped-query K or V (rows of `kv_heads * d`) expanded to one head per query head (rows of
/// `heads * d`): query head `i` gets K/V head `kv_of(i)`.
pub(super) fn expand_kv(
    x: &[f64],
    kv_heads: usize,
    heads: usize,
    d: usize,
    kv_of: impl Fn(usize) -> usize,
) -> Vec<f64> {
    x.chunks(kv_heads * d)
        .flat_map(|row| (0..heads).flat_map(|i| row[kv_of(i) * d..(kv_of(i) + 1) * d].to_vec()).collect::<Vec<_>>())
        .collect()
}

/// The K/V head of query head `i` of a launch with `heads` query heads and `kv_heads` K/V
/// heads: `i / (heads / kv_heads)` on one GPU, or with K/V replicated over `ranks` ranks, on
/// rank `rank`: `(rank * heads + i) / (heads * ranks / kv_heads)`.
pub(super) fn kv_of(heads: usize, kv_heads: usize, replicated: Option<(usize, usize)>) -> impl Fn(usize) -> usize {
    let (rank, ranks) = replicated.unwrap_or((0, 1));
    let group = heads * ranks / kv_heads;
    move |i| (rank * heads + i) / group
}

/// Per-row cross-entropy losses of `logits` (`rows x vocab`).
pub(super) fn cross_entropy(logits: &[f64], targets: &[u32], vocab: usize) -> Vec<f64> {
    logits
        .chunks(vocab)
        .zip(targets)
        .map(|(row, &t)| {
            let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            max + row.iter().map(|x| (x - max).exp()).sum::<f64>().ln() - row[t as usize]
        })
        .collect()
}

/// `sum(a * b)`.
pub(super) fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The gradient of `f` at `x` by central differences (step `1e-4`; the reference functions are
/// smooth and O(1), so the truncation error is about 1e-8).
pub(super) fn numerical_gradient(x: &[f64], f: impl Fn(&[f64]) -> f64) -> Vec<f64> {
    let step = 1e-4;
    let mut x = x.to_vec();
    (0..x.len())
        .map(|i| {
            let saved = x[i];
            x[i] = saved + step;
            let up = f(&x);
            x[i] = saved - step;
            let down = f(&x);
            x[i] = saved;
            (up - down) / (2.0 * step)
        })
        .collect()
}
