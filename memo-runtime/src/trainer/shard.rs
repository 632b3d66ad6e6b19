//! Which slice of the `t = 1` model each rank holds (`spec/tensor-parallel.md` §2), as runs of
//! whole rows: what rank-aware initialisation draws, and how the ranks' shards (parameters,
//! gradients) reassemble into the `t = 1` tensor.

use memo_plan_core::model::ModelConfig;
use memo_plan_core::plan::{Buffer, TensorRole};

/// What the split of the parameters depends on beyond the roles: the vocabulary (its padding),
/// whether FC1 stacks two products (SwiGLU's gate and up, each split over the ranks), and
/// whether K and V are replicated (`t > kv_heads`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardLayout {
    /// The vocabulary `V`.
    pub vocab: u64,
    /// The products stacked in FC1's rows (1, or 2 for SwiGLU).
    pub fc1_blocks: u64,
    /// Whether every rank holds all of K and V.
    pub kv_replicated: bool,
}

impl ShardLayout {
    /// The layout of `model`'s parameters over `ranks` ranks.
    pub fn of(model: &ModelConfig, ranks: u64) -> Self {
        ShardLayout {
            vocab: model.vocab,
            fc1_blocks: model.architecture.ffn_in_products(),
            kv_replicated: model.kv_replicated(ranks),
        }
    }

    /// A GPT's layout (one FC1 product, K and V split like Q) with vocabulary `vocab`.
    pub fn gpt(vocab: u64) -> Self {
        ShardLayout { vocab, fc1_blocks: 1, kv_replicated: false }
    }
}

/// How a parameter (or its gradient) is split across the ranks of a tensor-parallel group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shard {
    /// Every rank holds all of it (`t = 1`, norms, the row-parallel biases, replicated K and V).
    Whole,
    /// Column-parallel weights (`[out, in]`) whose `t = 1` rows are `blocks` products stacked
    /// (SwiGLU's gate then up; 1 otherwise): rank `rank` holds rows `[rank*n, (rank+1)*n)` of
    /// every block (`n` its rows per block), block after block.
    Rows {
        /// This rank.
        rank: u64,
        /// The group's size.
        ranks: u64,
        /// Products stacked.
        blocks: u64,
    },
    /// Row-parallel weights and column-parallel biases: rank `rank` holds elements
    /// `[rank*n, (rank+1)*n)` of every row (`n` the shard's elements per row). (SwiGLU with an FC1
    /// bias, which would need two blocks per row, is refused by the model's validation.)
    Columns {
        /// This rank.
        rank: u64,
        /// The group's size.
        ranks: u64,
    },
    /// The vocabulary-parallel embedding and classifier: rank `rank` holds vocabulary rows
    /// `[rank*rows, (rank+1)*rows)`; rows at or past `vocab` are zero padding.
    VocabRows {
        /// This rank.
        rank: u64,
        /// The group's size.
        ranks: u64,
        /// The vocabulary `V`.
        vocab: u64,
    },
}

impl Shard {
    /// How `role` is split on rank `rank` of `ranks` (`spec/tensor-parallel.md` §2).
    pub fn of(role: TensorRole, rank: u64, ranks: u64, layout: &ShardLayout) -> Shard {
        use TensorRole as R;
        if ranks <= 1 {
            return Shard::Whole;
        }
        let fc1 = layout.fc1_blocks.max(1);
        match role {
            R::KeyWeight | R::ValueWeight | R::KeyBias | R::ValueBias if layout.kv_replicated => Shard::Whole,
            R::QueryWeight | R::KeyWeight | R::ValueWeight => Shard::Rows { rank, ranks, blocks: 1 },
            R::Fc1Weight => Shard::Rows { rank, ranks, blocks: fc1 },
            R::QueryBias | R::KeyBias | R::ValueBias | R::Fc1Bias | R::ProjectionWeight | R::Fc2Weight => {
                Shard::Columns { rank, ranks }
            }
            R::Embedding | R::ClassifierWeight => Shard::VocabRows { rank, ranks, vocab: layout.vocab },
            _ => Shard::Whole,
        }
    }

    /// Whether every rank holds the same tensor.
    pub fn is_whole(self) -> bool {
        self == Shard::Whole
    }

    /// The shard's rows as runs, in order: `(rows, first)`, where the run's elements are the
    /// `t = 1` tensor's elements `first ..` (row-major, contiguous for the whole run), or padding
    /// (`None`). `per_row` is the shard's elements per row.
    pub fn runs(self, rows: u64, per_row: u64) -> Vec<(u64, Option<u64>)> {
        match self {
            Shard::Whole => vec![(rows, Some(0))],
            Shard::Rows { rank, ranks, blocks } => {
                // Each block of the whole tensor has `ranks * n` rows, n = rows / blocks.
                let n = rows / blocks.max(1);
                (0..blocks).map(|block| (n, Some((block * ranks * n + rank * n) * per_row))).collect()
            }
            Shard::Columns { rank, ranks } => {
                (0..rows).map(|row| (1, Some(row * per_row * ranks + rank * per_row))).collect()
            }
            Shard::VocabRows { rank, vocab, .. } => {
                let held = vocab.saturating_sub(rank * rows).min(rows);
                let mut runs = vec![(held, Some(rank * rows * per_row))];
                if held < rows {
                    runs.push((rows - held, None));
                }
                runs
            }
        }
    }

    /// The `t = 1` tensor of every rank's shard of `buffer` (`shards[k]` rank `k`'s bytes,
    /// `element` bytes per element): the inverse of [`Shard::runs`]. Padding is dropped; for a
    /// whole tensor, rank 0's. `None` when the shards do not have the buffer's size.
    pub fn reassemble(
        role: TensorRole,
        buffer: &Buffer,
        layout: &ShardLayout,
        element: u64,
        shards: &[Vec<u8>],
    ) -> Option<Vec<u8>> {
        let ranks = shards.len() as u64;
        let (rows, row_bytes) = (buffer.rows, buffer.row_bytes);
        if element == 0 || shards.iter().any(|s| s.len() as u64 != rows * row_bytes) {
            return None;
        }
        let per_row = row_bytes / element;
        let full_rows = match Shard::of(role, 0, ranks, layout) {
            Shard::Whole => return shards.first().cloned(),
            Shard::Rows { .. } => rows * ranks,
            Shard::Columns { .. } => rows,
            Shard::VocabRows { vocab, .. } => vocab,
        };
        let full_per_row = match Shard::of(role, 0, ranks, layout) {
            Shard::Columns { .. } => per_row * ranks,
            _ => per_row,
        };
        let mut full = vec![0u8; usize::try_from(full_rows * full_per_row * element).ok()?];
        for (rank, bytes) in shards.iter().enumerate() {
            let mut local = 0u64;
            for (run_rows, first) in Shard::of(role, rank as u64, ranks, layout).runs(rows, per_row) {
                let len = (run_rows * per_row * element) as usize;
                if let Some(first) = first {
                    let at = (first * element) as usize;
                    full.get_mut(at..at + len)?.copy_from_slice(bytes.get(local as usize..local as usize + len)?);
                }
                local += len as u64;
            }
        }
        Some(full)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memo_plan_core::plan::{BufferKind, Place};

    fn buffer(role: TensorRole, rows: u64, per_row: u64) -> Buffer {
        Buffer {
            kind: BufferKind::Parameter,
            role,
            layer: Some(0),
            slot: 0,
            rows,
            first_row: 0,
            row_bytes: 2 * per_row,
            place: Place::Device { offset: 0 },
        }
    }

    /// The shards of a `rows x per_row` tensor whose element `i` is `i`, per the runs.
    fn shards(role: TensorRole, ranks: u64, vocab: u64, rows: u64, per_row: u64) -> Vec<Vec<u8>> {
        (0..ranks)
            .map(|rank| {
                let mut out = Vec::new();
                for (n, first) in Shard::of(role, rank, ranks, &ShardLayout::gpt(vocab)).runs(rows, per_row) {
                    for i in 0..n * per_row {
                        let value = first.map_or(0xFFFF, |f| (f + i) as u16);
                        out.extend_from_slice(&value.to_le_bytes());
                    }
                }
                out
            })
            .collect()
    }

    #[test]
    fn shards_are_the_matching_slices_and_reassemble_to_the_whole() {
        // Column-parallel weight, 6 x 4 on 2 ranks: rank 1 has rows 3..6.
        let s = shards(TensorRole::QueryWeight, 2, 0, 3, 4);
        assert_eq!(u16::from_le_bytes([s[1][0], s[1][1]]), 12);
        // Row-parallel weight, 2 x 6 on 3 ranks: rank 2 has columns 4..6 of every row.
        let s = shards(TensorRole::Fc2Weight, 3, 0, 2, 2);
        let values: Vec<u16> = s[2].chunks(2).map(|p| u16::from_le_bytes([p[0], p[1]])).collect();
        assert_eq!(values, [4, 5, 10, 11]);
        // Embedding of 5 rows on 2 ranks (3 rows each): rank 1 holds rows 3, 4 and one pad row.
        let s = shards(TensorRole::Embedding, 2, 5, 3, 2);
        let values: Vec<u16> = s[1].chunks(2).map(|p| u16::from_le_bytes([p[0], p[1]])).collect();
        assert_eq!(values, [6, 7, 8, 9, 0xFFFF, 0xFFFF]);
        for (role, ranks, vocab, rows, per_row, full) in [
            (TensorRole::QueryWeight, 2, 0, 3, 4, 24),
            (TensorRole::Fc1Bias, 4, 0, 1, 3, 12),
            (TensorRole::ProjectionWeight, 3, 0, 2, 2, 12),
            (TensorRole::Embedding, 2, 5, 3, 2, 10),
            (TensorRole::Embedding, 4, 6, 2, 1, 6),
            (TensorRole::NormScale1, 3, 0, 1, 5, 5),
        ] {
            let s = shards(role, ranks, vocab, rows, per_row);
            let whole = Shard::reassemble(role, &buffer(role, rows, per_row), &ShardLayout::gpt(vocab), 2, &s).unwrap();
            let values: Vec<u16> = whole.chunks(2).map(|p| u16::from_le_bytes([p[0], p[1]])).collect();
            assert_eq!(values, (0..full).map(|i| i as u16).collect::<Vec<_>>(), "{role:?} on {ranks}");
        }
        assert!(Shard::reassemble(
            TensorRole::QueryWeight,
            &buffer(TensorRole::QueryWeight, 3, 4),
            &ShardLayout::gpt(0),
            2,
            &[vec![0; 3]]
        )
        .is_none());
    }
}
