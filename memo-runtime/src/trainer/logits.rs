//! Reading the model's predictions back: the plan's instructions replayed only up to each
//! classifier launch, then that chunk's logits downloaded before the cross-entropy replaces them
//! by their gradient.
//!
//! Why this is a true forward of the trained model and changes nothing: the prefix is the very
//! instruction stream a step runs (same kernels, same places), and it stops before the
//! cross-entropy, the backward and AdamW. What the prefix writes besides activations is the
//! summed loss and the embedding gradient (zeroed just before the classifier), and between two
//! chunks the first chunk's cross-entropy and backward: every one of them is zeroed or
//! overwritten by the next step before it is read. Parameters, optimizer state and the step
//! count are untouched (pinned by `evaluation_leaves_training_bit_identical` in
//! `memo-cli/tests/recall.rs`).

use half::bf16;
use memo_plan_core::plan::{Action, Op, TensorRole};

use super::Trainer;
use crate::backend::{Backend, Space, Span};
use crate::error::{PlanMismatch, RuntimeError, TokenError};

impl<B: Backend> Trainer<B> {
    /// The logits of every row of `tokens` (`micro_batch * seq_len` tokens, as for
    /// [`Trainer::step`]): row-major `rows x vocab`, the classifier's bf16 widened to f32.
    pub fn logits(&mut self, tokens: &[u32]) -> Result<Vec<f32>, RuntimeError> {
        let rows = self.context.loss_scale_tokens as usize;
        let vocab = self.context.vocab as usize;
        if tokens.len() != rows {
            return Err(TokenError::LogitsLength { expected: rows, tokens: tokens.len() }.into());
        }
        if let Some(bad) = tokens.iter().find(|&&t| u64::from(t) >= self.context.vocab) {
            return Err(TokenError::OutsideVocabulary { token: *bad, vocab: self.context.vocab }.into());
        }
        let bytes: Vec<u8> = tokens.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.backend.upload(self.replay.span(self.tokens), &bytes)?;

        // Each classifier launch: its instruction, the token rows it covers (its `x` argument,
        // the final norm's output) and the logits rows it writes.
        let mut chunks = Vec::new();
        for (index, instruction) in self.replay.plan().instructions.iter().enumerate() {
            let Action::Launch(launch) = &instruction.action else { continue };
            if launch.op != Op::Classifier {
                continue;
            }
            let (Some(x), Some(logits)) = (launch.args.first(), launch.args.get(2)) else {
                return Err(PlanMismatch::ClassifierWithoutArguments { instruction: index }.into());
            };
            let (x, logits) = (x.region, logits.region);
            let buffers = &self.replay.plan().buffers;
            let x_role = buffers.get(x.buffer.index()).map(|b| b.role);
            let logits_row_bytes = buffers.get(logits.buffer.index()).map_or(0, |b| b.row_bytes);
            if x_role != Some(TensorRole::FinalNormOutput)
                || logits.end - logits.start != x.end - x.start
                || logits_row_bytes != 2 * vocab as u64
            {
                return Err(PlanMismatch::ClassifierNotSingleGpu { instruction: index, vocab: vocab as u64 }.into());
            }
            let whole = self.replay.span(logits.buffer);
            let span = Span {
                space: whole.space,
                offset: whole.offset + logits.start * logits_row_bytes,
                len: (logits.end - logits.start) * logits_row_bytes,
            };
            chunks.push((index, x.start as usize, x.end as usize, span));
        }

        let mut out = vec![f32::NAN; rows * vocab];
        let mut covered = vec![false; rows];
        let mut next = 0;
        for (index, start, end, span) in chunks {
            self.replay.run_range(&mut self.backend, &self.context, next..index + 1)?;
            next = index + 1;
            if span.space != Space::Device || end > rows {
                return Err(PlanMismatch::ClassifierRowsOutside { instruction: index, start, end, rows }.into());
            }
            let bytes = self.backend.download(span)?;
            for (value, pair) in out[start * vocab..end * vocab].iter_mut().zip(bytes.chunks_exact(2)) {
                *value = bf16::from_le_bytes([pair[0], pair[1]]).to_f32();
            }
            covered[start..end].iter_mut().for_each(|c| *c = true);
        }
        if let Some(missing) = covered.iter().position(|c| !c) {
            return Err(PlanMismatch::UncoveredTokenRow { row: missing }.into());
        }
        Ok(out)
    }
}
