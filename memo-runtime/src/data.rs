//! Training data: a byte-level tokenizer over any text, and the sampler that cuts it into
//! sequences. Token `i` of a sequence predicts token `i + 1`. The synthetic recall task lives in
//! [`crate::recall`].

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

pub use crate::recall::{RecallTask, RECALL_KEYS};

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
    fn entropy_of_a_uniform_text() {
        let data = TextData::from_bytes(b"abcdabcd").unwrap();
        assert!((data.unigram_entropy() - 4f64.ln()).abs() < 1e-12);
        assert!(TextData::from_bytes(DEFAULT_TEXT.as_bytes()).unwrap().unigram_entropy() > 2.0);
    }
}
