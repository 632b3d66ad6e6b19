//! Training data: a byte-level tokenizer over any text, and the sampler that cuts it into
//! sequences. Token `i` of a sequence predicts token `i + 1`.

/// The byte-level vocabulary: one token per byte value.
pub const BYTE_VOCAB: u64 = 256;

/// A small public-domain text shipped with the project: the default training data.
pub const DEFAULT_TEXT: &str = include_str!("../data/public-domain.txt");

/// A text as tokens, and where the next sequence starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TextData {
    tokens: Vec<u32>,
    position: u64,
}

impl TextData {
    /// Tokenises `bytes` (one token per byte). Needs at least 2 bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, String> {
        if bytes.len() < 2 {
            return Err(format!("the training text has {} byte(s): it needs at least 2", bytes.len()));
        }
        Ok(TextData { tokens: bytes.iter().map(|&b| u32::from(b)).collect(), position: 0 })
    }

    /// Where the next sequence starts (saved in checkpoints).
    pub fn position(&self) -> u64 {
        self.position
    }

    /// Resumes at `position` (from a checkpoint), wrapped into the text.
    pub fn seek(&mut self, position: u64) {
        self.position = position % self.tokens.len() as u64;
    }

    /// Tokens in the text.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether the text is empty (never: construction needs 2 bytes).
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The next `sequences` windows of `seq_len` tokens and their next-token targets, read
    /// consecutively from the text and wrapping around at its end.
    pub fn next_batch(&mut self, sequences: usize, seq_len: usize) -> (Vec<u32>, Vec<u32>) {
        let n = self.tokens.len();
        let mut tokens = Vec::with_capacity(sequences * seq_len);
        let mut targets = Vec::with_capacity(sequences * seq_len);
        for _ in 0..sequences {
            let start = self.position as usize;
            for i in 0..seq_len {
                tokens.push(self.tokens[(start + i) % n]);
                targets.push(self.tokens[(start + i + 1) % n]);
            }
            self.position = ((start + seq_len) % n) as u64;
        }
        (tokens, targets)
    }

    /// The entropy, in nats per token, of the text's byte frequencies: the loss of the best model
    /// that ignores context. A trained model must fall well below it.
    pub fn unigram_entropy(&self) -> f64 {
        let mut counts = [0u64; 256];
        for &t in &self.tokens {
            counts[(t & 0xFF) as usize] += 1;
        }
        let n = self.tokens.len() as f64;
        counts.iter().filter(|&&c| c > 0).map(|&c| c as f64 / n).map(|p| -p * p.ln()).sum()
    }
}

/// A synthetic long-range task: recall a key seen at the start of the sequence at its very end.
///
/// Each sequence is `KEY_MARK, key, filler..., QUERY_MARK`, the key one of [`RECALL_KEYS`] values
/// drawn per sequence, the filler a fixed cycle of 16 bytes. Every next-token target is
/// predictable from position alone except two: the key itself (chance, `ln 4` nats) and the
/// answer after `QUERY_MARK`, which only attention back over the whole sequence (`s - 1` tokens)
/// can give. So `loss * tokens - ln 4` per sequence, once the filler is learnt, is the answer's
/// cross-entropy: `ln 4` (1.386) at chance, near 0 when the model recalls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecallTask {
    seed: u64,
    /// Sequences produced so far (the resumable position).
    produced: u64,
}

/// How many different keys the recall task draws from.
pub const RECALL_KEYS: u32 = 4;
const KEY_MARK: u32 = 1;
const FIRST_KEY: u32 = 2;
const QUERY_MARK: u32 = 6;
const FILLER: u32 = 16;

impl RecallTask {
    /// The task's sequences for `seed`, from the first.
    pub fn new(seed: u64) -> Self {
        RecallTask { seed, produced: 0 }
    }

    /// Sequences produced so far (saved in checkpoints).
    pub fn position(&self) -> u64 {
        self.produced
    }

    /// Resumes after `position` sequences.
    pub fn seek(&mut self, position: u64) {
        self.produced = position;
    }

    /// The next `sequences` sequences of `seq_len` tokens (at least 4) and their targets.
    pub fn next_batch(&mut self, sequences: usize, seq_len: usize) -> (Vec<u32>, Vec<u32>) {
        let mut tokens = Vec::with_capacity(sequences * seq_len);
        let mut targets = Vec::with_capacity(sequences * seq_len);
        for _ in 0..sequences {
            let mut rng = memo_plan_core::generate::SplitMix64::new(
                self.seed ^ self.produced.wrapping_mul(0x9E37_79B9_7F4A_7C15),
            );
            let key = FIRST_KEY + rng.below(u64::from(RECALL_KEYS)) as u32;
            let sequence: Vec<u32> = (0..seq_len)
                .map(|i| match i {
                    0 => KEY_MARK,
                    1 => key,
                    i if i + 1 == seq_len => QUERY_MARK,
                    i => FILLER + (i as u32 % 16),
                })
                .collect();
            targets.extend(sequence.iter().skip(1).copied().chain([key]));
            tokens.extend(sequence);
            self.produced += 1;
        }
        (tokens, targets)
    }

    /// The answer's cross-entropy estimated from a step's mean loss, assuming every position but
    /// the key and the answer is predicted perfectly (an upper bound on it otherwise).
    pub fn answer_loss(mean_loss: f32, seq_len: usize) -> f64 {
        f64::from(mean_loss) * seq_len as f64 - f64::from(RECALL_KEYS).ln()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_follow_each_other_and_wrap() {
        let mut data = TextData::from_bytes(b"abcdef").unwrap();
        let (tokens, targets) = data.next_batch(2, 4);
        assert_eq!(tokens, [97, 98, 99, 100, 101, 102, 97, 98]);
        assert_eq!(targets, [98, 99, 100, 101, 102, 97, 98, 99]);
        assert_eq!(data.position(), 2);
        assert!(TextData::from_bytes(b"a").is_err());
    }

    #[test]
    fn recall_sequences_end_with_their_key_as_target() {
        let mut task = RecallTask::new(3);
        let (tokens, targets) = task.next_batch(3, 10);
        for s in 0..3 {
            let (t, y) = (&tokens[s * 10..(s + 1) * 10], &targets[s * 10..(s + 1) * 10]);
            assert_eq!(t[0], KEY_MARK);
            assert_eq!(y[9], t[1], "the last target is the key");
            assert_eq!(t[9], QUERY_MARK);
            assert_eq!(&y[..9], &t[1..]);
        }
        let mut again = RecallTask::new(3);
        again.seek(1);
        assert_eq!(again.next_batch(1, 10).0, tokens[10..20]);
    }

    #[test]
    fn entropy_of_a_uniform_text() {
        let data = TextData::from_bytes(b"abcdabcd").unwrap();
        assert!((data.unigram_entropy() - 4f64.ln()).abs() < 1e-12);
        assert!(TextData::from_bytes(DEFAULT_TEXT.as_bytes()).unwrap().unigram_entropy() > 2.0);
    }
}
