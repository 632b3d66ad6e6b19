//! The synthetic long-range task: recall a key seen far back in the sequence, and the evaluation
//! that measures, per key-to-query distance, how often the model's prediction is that key.
//!
//! A sequence of `s` tokens is a fixed 16-byte filler cycle (token `FILLER + i % 16` at position
//! `i`) with insertions: `KEY_MARK, key` ending `d` tokens before the last position, and
//! `QUERY_MARK` at the last position (and, in training, at some positions between), whose target
//! is the key. The key is one of [`RECALL_KEYS`] tokens drawn per sequence, distinct from the
//! filler and the marks; it appears once in the input and nothing else depends on it, so the only
//! way to answer a query above chance is to attend back to the key.
//!
//! Only the query rows are trained on: every other row's target is [`PAD_TARGET`], a constant the
//! model learns in a few steps, after which those rows carry no gradient. This stands in for the
//! ignore-index mask of such benchmarks, which the plan's `cross_entropy` does not have; with
//! next-token targets instead, the mark's and the key's own unpredictable arrival (several nats a
//! sequence) drowned the answer's signal and the tiny model stayed at chance even at distance 1
//! (`s = 32`, 1,500 steps; `BENCHMARKS.md`).
//!
//! Training draws `d` uniformly from `[1, s - 2]` and puts a query at each position after the key
//! with probability `1 / QUERY_EVERY`: early queries see a short context, where the retrieval is
//! easy to learn, and later ones use it over long distances. The evaluation scores fresh
//! sequences with one query, at the end, per distance bucket, and a control with the key removed,
//! where no model can beat chance.

use memo_plan_core::generate::SplitMix64;

use crate::backend::Backend;
use crate::error::{PlanMismatch, RuntimeError};
use crate::trainer::Trainer;

/// How many different keys the task draws from: chance accuracy is `1 / RECALL_KEYS`.
pub const RECALL_KEYS: u32 = 4;
/// The token before the key.
pub const KEY_MARK: u32 = 1;
/// The first key token; the keys are `FIRST_KEY..FIRST_KEY + RECALL_KEYS`.
pub const FIRST_KEY: u32 = 2;
/// The last token of every sequence: its target is the key.
pub const QUERY_MARK: u32 = 6;
/// The first filler token; the filler cycles through `FILLER..FILLER + FILLER_CYCLE`.
pub const FILLER: u32 = 16;
/// The filler's period.
pub const FILLER_CYCLE: u32 = 16;
/// The target of every row that is not a query (see the module's documentation).
pub const PAD_TARGET: u32 = 0;
/// In training, each position between the key and the last is a query with probability
/// `1 / QUERY_EVERY`.
pub const QUERY_EVERY: u64 = 8;
/// The shortest sequence that holds a mark, a key and a query.
pub const MIN_RECALL_SEQ_LEN: usize = 3;

/// Salts the evaluation's generator so that its sequences are drawn apart from training's.
const EVALUATION_SALT: u64 = 0x005E_ED0F_E7A1_0A7E;

/// One sequence of the task, with what the evaluation needs to score it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecallSequence {
    /// The tokens.
    pub tokens: Vec<u32>,
    /// Targets: the key at each query, [`PAD_TARGET`] elsewhere.
    pub targets: Vec<u32>,
    /// The key token (the last target).
    pub key: u32,
    /// Positions from the key to the last query, or `None` when the key was removed (the control).
    pub distance: Option<usize>,
    /// The key's position, `None` in the control.
    pub key_position: Option<usize>,
}

impl RecallSequence {
    /// `seq_len` tokens recalling key number `key_index` (`< RECALL_KEYS`) from `distance`
    /// positions back (`1..=seq_len - 2`); `None` builds the control: the same filler and query,
    /// the mark and the key replaced by filler, the target still the key.
    pub fn new(seq_len: usize, key_index: u32, distance: Option<usize>) -> Result<Self, String> {
        if seq_len < MIN_RECALL_SEQ_LEN {
            return Err(format!(
                "a recall sequence of {seq_len} tokens: it needs at least {MIN_RECALL_SEQ_LEN} (mark, key, query)"
            ));
        }
        if key_index >= RECALL_KEYS {
            return Err(format!("key number {key_index}: the task has {RECALL_KEYS} keys"));
        }
        let query = seq_len - 1;
        if let Some(d) = distance {
            if d == 0 || d > seq_len - 2 {
                return Err(format!(
                    "a key {d} positions before the query of a {seq_len}-token sequence: use 1..={}",
                    seq_len - 2
                ));
            }
        }
        let key = FIRST_KEY + key_index;
        let key_position = distance.map(|d| query - d);
        let tokens: Vec<u32> = (0..seq_len)
            .map(|i| match key_position {
                _ if i == query => QUERY_MARK,
                Some(k) if i == k => key,
                Some(k) if i + 1 == k => KEY_MARK,
                _ => FILLER + (i as u32 % FILLER_CYCLE),
            })
            .collect();
        let targets = (0..seq_len).map(|i| if i == query { key } else { PAD_TARGET }).collect();
        Ok(RecallSequence { tokens, targets, key, distance, key_position })
    }

    /// Adds queries at `positions`, each after the key (or its place) and before the last.
    pub fn with_queries(mut self, positions: impl IntoIterator<Item = usize>) -> Result<Self, String> {
        let last = self.tokens.len() - 1;
        let first = self.key_position.map_or(0, |k| k + 1);
        for position in positions {
            if !(first..last).contains(&position) {
                return Err(format!(
                    "a query at position {position}: queries go between the key and the last position, {first}..{last}"
                ));
            }
            self.tokens[position] = QUERY_MARK;
            self.targets[position] = self.key;
        }
        Ok(self)
    }
}

/// The training stream: sequences with a fresh key and distance each, resumable by count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecallTask {
    seed: u64,
    /// Sequences produced so far (the resumable position).
    produced: u64,
}

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

    /// The next `sequences` sequences of `seq_len` tokens and their targets. Sequence `n` depends
    /// on the seed and `n` alone: its key uniform over the keys, its distance to the last query
    /// uniform over `[1, seq_len - 2]`, each position between a query with probability
    /// `1 / QUERY_EVERY`. Below [`MIN_RECALL_SEQ_LEN`] tokens no key fits: the sequences are
    /// filler and a query (`memo train` refuses such lengths before asking).
    pub fn next_batch(&mut self, sequences: usize, seq_len: usize) -> (Vec<u32>, Vec<u32>) {
        let mut tokens = Vec::with_capacity(sequences * seq_len);
        let mut targets = Vec::with_capacity(sequences * seq_len);
        for _ in 0..sequences {
            let mut rng = SplitMix64::new(self.seed ^ self.produced.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let key_index = rng.below(u64::from(RECALL_KEYS)) as u32;
            let distance = 1 + rng.below(seq_len.saturating_sub(2) as u64) as usize;
            let between = (seq_len.saturating_sub(1 + distance)..seq_len.saturating_sub(1)).skip(1);
            let queries: Vec<usize> = between.filter(|_| rng.below(QUERY_EVERY) == 0).collect();
            match RecallSequence::new(seq_len, key_index, Some(distance)).and_then(|s| s.with_queries(queries)) {
                Ok(sequence) => {
                    tokens.extend(sequence.tokens);
                    targets.extend(sequence.targets);
                }
                Err(_) => {
                    let filler = (0..seq_len).map(|i| if i + 1 == seq_len { QUERY_MARK } else { FILLER });
                    tokens.extend(filler);
                    targets.extend(
                        (0..seq_len).map(|i| if i + 1 == seq_len { FIRST_KEY + key_index } else { PAD_TARGET }),
                    );
                }
            }
            self.produced += 1;
        }
        (tokens, targets)
    }
}

/// The distance buckets the evaluation reports for sequences of `seq_len` tokens, as inclusive
/// ranges: up to `s/16`, `s/4`, `3s/4` and `s - 2` (at `s = 256`: 1-16, 17-64, 65-192, 193-254),
/// empty ones left out.
pub fn distance_buckets(seq_len: usize) -> Vec<(usize, usize)> {
    let longest = seq_len.saturating_sub(2);
    let mut buckets = Vec::new();
    let mut low = 1;
    for edge in [seq_len / 16, seq_len / 4, seq_len * 3 / 4, longest] {
        let high = edge.min(longest);
        if high >= low {
            buckets.push((low, high));
            low = high + 1;
        }
    }
    buckets
}

/// The held-out evaluation set: `per_bucket` sequences per distance bucket (distance uniform in
/// the bucket, key uniform), then the control: `per_bucket` sequences with the key removed. Drawn
/// from `seed` through a salted generator, apart from the training stream.
pub fn evaluation_set(seed: u64, seq_len: usize, per_bucket: usize) -> Result<Vec<RecallSequence>, String> {
    evaluation_sequences(seed, seq_len, per_bucket).collect()
}

/// [`evaluation_set`] one sequence at a time, so that a large evaluation needs no more memory
/// than a batch.
fn evaluation_sequences(
    seed: u64,
    seq_len: usize,
    per_bucket: usize,
) -> impl Iterator<Item = Result<RecallSequence, String>> {
    let mut rng = SplitMix64::new(seed ^ EVALUATION_SALT);
    let groups = distance_buckets(seq_len).into_iter().map(Some).chain([None]);
    groups.flat_map(move |group| std::iter::repeat_n(group, per_bucket)).map(move |group| {
        let key_index = rng.below(u64::from(RECALL_KEYS)) as u32;
        let distance = group.map(|(low, high)| low + rng.below((high - low + 1) as u64) as usize);
        RecallSequence::new(seq_len, key_index, distance)
    })
}

/// How one query was answered.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QueryScore {
    /// 1 when the key's logit is the largest of the [`RECALL_KEYS`] keys' logits, `1 / k` when it
    /// ties with `k - 1` others for the largest (the expected score of a random tie-break), else 0.
    pub key_credit: f64,
    /// The same over the whole vocabulary.
    pub vocab_credit: f64,
    /// The natural log of the key's probability under the softmax over the whole vocabulary.
    pub log_probability: f64,
}

/// Scores the logits of a query row (one per vocabulary token) against `key`. A NaN logit
/// never wins; a missing key scores 0 and a NaN log-probability.
pub fn score_query(logits: &[f32], key: u32) -> QueryScore {
    let credit = |candidates: &[f32]| -> f64 {
        let Some(&mine) = logits.get(key as usize) else { return 0.0 };
        let best = candidates.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if mine.is_nan() || mine < best {
            return 0.0;
        }
        1.0 / candidates.iter().filter(|&&v| v == best).count().max(1) as f64
    };
    let keys = logits.get(FIRST_KEY as usize..(FIRST_KEY + RECALL_KEYS) as usize).unwrap_or(&[]);
    let log_probability = match logits.get(key as usize) {
        Some(&mine) => {
            let best = logits.iter().map(|&v| f64::from(v)).fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = logits.iter().map(|&v| (f64::from(v) - best).exp()).sum();
            f64::from(mine) - best - sum.ln()
        }
        None => f64::NAN,
    };
    QueryScore { key_credit: credit(keys), vocab_credit: credit(logits), log_probability }
}

/// The evaluation of one group of sequences: a distance bucket, or the control.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BucketScore {
    /// The bucket's distances (inclusive), or `None` for the control (key removed).
    pub distances: Option<(usize, usize)>,
    /// Sequences scored.
    pub sequences: usize,
    /// Mean key credit: the accuracy of the argmax over the keys (chance `1 / RECALL_KEYS`).
    pub key_accuracy: f64,
    /// Mean vocabulary credit: the accuracy of the argmax over the whole vocabulary.
    pub vocab_accuracy: f64,
    /// Mean cross-entropy of the answer, nats (chance over the keys alone: `ln RECALL_KEYS`).
    pub answer_loss: f64,
    /// Mean probability of the key.
    pub answer_probability: f64,
}

impl BucketScore {
    fn empty(distances: Option<(usize, usize)>) -> Self {
        BucketScore {
            distances,
            sequences: 0,
            key_accuracy: 0.0,
            vocab_accuracy: 0.0,
            answer_loss: 0.0,
            answer_probability: 0.0,
        }
    }

    /// Adds a query's score (the means are finished by [`BucketScore::finish`]).
    fn add(&mut self, score: QueryScore) {
        self.sequences += 1;
        self.key_accuracy += score.key_credit;
        self.vocab_accuracy += score.vocab_credit;
        self.answer_loss -= score.log_probability;
        self.answer_probability += score.log_probability.exp();
    }

    fn finish(mut self) -> Self {
        let n = self.sequences.max(1) as f64;
        self.key_accuracy /= n;
        self.vocab_accuracy /= n;
        self.answer_loss /= n;
        self.answer_probability /= n;
        self
    }
}

/// The evaluation: per distance bucket, then the control.
#[derive(Clone, Debug, PartialEq)]
pub struct RecallEvaluation {
    /// One score per distance bucket, shortest first.
    pub buckets: Vec<BucketScore>,
    /// The control: the same queries with the key removed.
    pub key_removed: BucketScore,
}

/// Scores `set` from the logits of its query rows: `query_logits[i]` is sequence `i`'s.
pub fn score_set(set: &[RecallSequence], query_logits: &[Vec<f32>]) -> RecallEvaluation {
    let mut tally = Tally::new(set.first().map_or(0, |s| s.tokens.len()));
    for (sequence, logits) in set.iter().zip(query_logits) {
        tally.add(sequence, logits);
    }
    tally.finish()
}

/// Scores summed per bucket and for the control, as queries come.
struct Tally {
    buckets: Vec<BucketScore>,
    key_removed: BucketScore,
}

impl Tally {
    fn new(seq_len: usize) -> Self {
        let buckets = distance_buckets(seq_len).into_iter().map(|b| BucketScore::empty(Some(b))).collect();
        Tally { buckets, key_removed: BucketScore::empty(None) }
    }

    fn add(&mut self, sequence: &RecallSequence, logits: &[f32]) {
        let score = score_query(logits, sequence.key);
        let in_bucket =
            |b: &&mut BucketScore, d: usize| b.distances.is_some_and(|(low, high)| (low..=high).contains(&d));
        match sequence.distance {
            None => self.key_removed.add(score),
            Some(d) => {
                if let Some(bucket) = self.buckets.iter_mut().find(|b| in_bucket(b, d)) {
                    bucket.add(score);
                }
            }
        }
    }

    fn finish(self) -> RecallEvaluation {
        RecallEvaluation {
            buckets: self.buckets.into_iter().filter(|b| b.sequences > 0).map(BucketScore::finish).collect(),
            key_removed: self.key_removed.finish(),
        }
    }
}

/// Evaluates `trainer` on the held-out set of `per_bucket` sequences per bucket (see
/// [`evaluation_set`]): the logits of each query row, read by a forward-only replay
/// ([`Trainer::logits`]), so the model is left as it was. Sequences go `micro_batch` at a time;
/// the last batch is padded with repeats that are not scored.
pub fn evaluate<B: Backend>(
    trainer: &mut Trainer<B>,
    seed: u64,
    per_bucket: usize,
) -> Result<RecallEvaluation, RuntimeError> {
    let model = &trainer.report().plan.provenance.model;
    let (seq_len, micro_batch) = (model.seq_len as usize, model.micro_batch.max(1) as usize);
    let vocab = model.vocab as usize;
    let mut sequences = evaluation_sequences(seed, seq_len, per_bucket).peekable();
    let mut tally = Tally::new(seq_len);
    let mut batch = Vec::with_capacity(micro_batch);
    while sequences.peek().is_some() {
        batch.clear();
        for sequence in sequences.by_ref().take(micro_batch) {
            batch.push(sequence.map_err(RuntimeError::Recall)?);
        }
        let mut tokens = Vec::with_capacity(micro_batch * seq_len);
        for i in 0..micro_batch {
            // Pads a short last batch with repeats of its last sequence, not scored.
            if let Some(sequence) = batch.get(i).or(batch.last()) {
                tokens.extend_from_slice(&sequence.tokens);
            }
        }
        let logits = trainer.logits(&tokens)?;
        for (i, sequence) in batch.iter().enumerate() {
            let row = i * seq_len + seq_len - 1;
            let row_logits = logits
                .get(row * vocab..(row + 1) * vocab)
                .ok_or(PlanMismatch::LogitsTooShort { values: logits.len(), row })?;
            tally.add(sequence, row_logits);
        }
    }
    Ok(tally.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_filler(t: u32) -> bool {
        (FILLER..FILLER + FILLER_CYCLE).contains(&t)
    }

    #[test]
    fn a_sequence_holds_its_key_at_its_distance_and_asks_for_it_last() {
        let sequence = RecallSequence::new(12, 3, Some(4)).unwrap();
        let t = &sequence.tokens;
        assert_eq!(sequence.key, FIRST_KEY + 3);
        assert_eq!((t[6], t[7], t[11]), (KEY_MARK, FIRST_KEY + 3, QUERY_MARK), "{t:?}");
        assert_eq!(sequence.key_position, Some(7));
        for (i, &token) in t.iter().enumerate().filter(|(i, _)| ![6, 7, 11].contains(i)) {
            assert_eq!(token, FILLER + i as u32 % FILLER_CYCLE, "position {i}");
        }
        let mut want = vec![PAD_TARGET; 12];
        want[11] = sequence.key;
        assert_eq!(sequence.targets, want);
        // The farthest and nearest keys, and what does not fit.
        assert_eq!(RecallSequence::new(12, 0, Some(10)).unwrap().tokens[..2], [KEY_MARK, FIRST_KEY]);
        assert_eq!(RecallSequence::new(12, 0, Some(1)).unwrap().tokens[9..], [KEY_MARK, FIRST_KEY, QUERY_MARK]);
        assert!(RecallSequence::new(12, 0, Some(11)).is_err());
        assert!(RecallSequence::new(12, 0, Some(0)).is_err());
        assert!(RecallSequence::new(12, RECALL_KEYS, Some(3)).is_err());
        assert!(RecallSequence::new(2, 0, None).is_err());
    }

    #[test]
    fn the_control_has_no_key_anywhere() {
        let sequence = RecallSequence::new(12, 1, None).unwrap();
        assert!(sequence.tokens[..11].iter().all(|&t| is_filler(t)), "{:?}", sequence.tokens);
        assert_eq!(sequence.tokens[11], QUERY_MARK);
        assert_eq!(sequence.targets[11], FIRST_KEY + 1);
    }

    #[test]
    fn extra_queries_go_between_the_key_and_the_end() {
        let sequence = RecallSequence::new(12, 2, Some(5)).unwrap().with_queries([7, 9]).unwrap();
        assert_eq!((sequence.tokens[7], sequence.tokens[9]), (QUERY_MARK, QUERY_MARK));
        assert_eq!((sequence.targets[7], sequence.targets[9]), (sequence.key, sequence.key));
        let sequence = RecallSequence::new(12, 2, Some(5)).unwrap();
        assert!(sequence.clone().with_queries([6]).is_err(), "on the key");
        assert!(sequence.with_queries([11]).is_err(), "the last is a query already");
    }

    /// Every training sequence: keys and marks distinct from the filler, the key exactly once,
    /// every query after it, targets the key at queries and padding elsewhere; distances cover
    /// `[1, s - 2]`; the stream is a function of (seed, sequence number).
    #[test]
    fn the_training_stream_covers_every_distance_deterministically() {
        for key in FIRST_KEY..FIRST_KEY + RECALL_KEYS {
            assert!(!is_filler(key) && key != KEY_MARK && key != QUERY_MARK && key != PAD_TARGET);
        }
        let s = 20;
        let mut task = RecallTask::new(7);
        let (tokens, targets) = task.next_batch(400, s);
        let mut distances = std::collections::BTreeSet::new();
        let mut keys = std::collections::BTreeSet::new();
        for (t, y) in tokens.chunks(s).zip(targets.chunks(s)) {
            let positions: Vec<usize> = (0..s).filter(|&i| !is_filler(t[i]) && t[i] != QUERY_MARK).collect();
            assert_eq!(positions.len(), 2, "a mark and a key: {t:?}");
            let k = positions[1];
            assert_eq!((t[k - 1], t[k]), (KEY_MARK, y[s - 1]), "{t:?}");
            assert_eq!(t[s - 1], QUERY_MARK);
            for i in 0..s {
                let want = if t[i] == QUERY_MARK { t[k] } else { PAD_TARGET };
                assert_eq!(y[i], want, "row {i} of {t:?}");
                assert!(t[i] != QUERY_MARK || i > k, "a query before the key: {t:?}");
            }
            distances.insert(s - 1 - k);
            keys.insert(t[k]);
        }
        assert_eq!(distances, (1..=s - 2).collect(), "every distance 1..=s-2 occurs");
        assert_eq!(keys.len(), RECALL_KEYS as usize);
        let mut again = RecallTask::new(7);
        again.seek(3);
        assert_eq!(again.next_batch(2, s), (tokens[3 * s..5 * s].to_vec(), targets[3 * s..5 * s].to_vec()));
        assert_eq!(again.position(), 5);
        assert_ne!(RecallTask::new(8).next_batch(4, s), (tokens[..4 * s].to_vec(), targets[..4 * s].to_vec()));
        // Too short to hold a key: no panic, a query still asks.
        let (short, short_targets) = RecallTask::new(7).next_batch(2, 2);
        assert_eq!((short.len(), short_targets.len()), (4, 4));
    }

    #[test]
    fn buckets_split_the_distances_at_a_sixteenth_a_quarter_and_three_quarters() {
        assert_eq!(distance_buckets(256), [(1, 16), (17, 64), (65, 192), (193, 254)]);
        assert_eq!(distance_buckets(32), [(1, 2), (3, 8), (9, 24), (25, 30)]);
        assert_eq!(distance_buckets(4), [(1, 1), (2, 2)]);
        assert_eq!(distance_buckets(3), [(1, 1)]);
        assert!(distance_buckets(2).is_empty());
        let set = evaluation_set(1, 64, 5).unwrap();
        assert_eq!(set.len(), 5 * 5);
        for (i, sequence) in set.iter().enumerate() {
            match (i / 5, sequence.distance) {
                (4, None) => {}
                (b, Some(d)) => {
                    let (low, high) = distance_buckets(64)[b];
                    assert!((low..=high).contains(&d), "sequence {i}: distance {d} outside {low}..={high}");
                }
                (b, None) => panic!("sequence {i} of bucket {b} has no key"),
            }
        }
        assert_eq!(set, evaluation_set(1, 64, 5).unwrap());
    }

    fn logits_with(values: &[(u32, f32)]) -> Vec<f32> {
        let mut logits = vec![0.0f32; 16];
        for &(token, value) in values {
            logits[token as usize] = value;
        }
        logits
    }

    #[test]
    fn a_query_scores_its_argmax_ties_and_probability() {
        let key = FIRST_KEY + 1;
        // The key wins among the keys but a filler token wins the vocabulary.
        let score = score_query(&logits_with(&[(key, 2.0), (FIRST_KEY, 1.0), (9, 3.0)]), key);
        assert_eq!((score.key_credit, score.vocab_credit), (1.0, 0.0));
        let z = 13.0 + 2f64.exp() + 1f64.exp() + 3f64.exp();
        assert!((score.log_probability - (2.0 - z.ln())).abs() < 1e-12, "{score:?}");
        // A tie of two keys for the top earns half; a loss earns nothing.
        let tie = score_query(&logits_with(&[(key, 5.0), (FIRST_KEY + 3, 5.0)]), key);
        assert_eq!((tie.key_credit, tie.vocab_credit), (0.5, 0.5));
        assert_eq!(score_query(&logits_with(&[(FIRST_KEY, 1.0)]), key).key_credit, 0.0);
        // All equal: a quarter over the keys, 1/16 over this vocabulary; ln(1/16).
        let flat = score_query(&[0.0; 16], key);
        assert_eq!((flat.key_credit, flat.vocab_credit), (0.25, 1.0 / 16.0));
        assert!((flat.log_probability + 16f64.ln()).abs() < 1e-12);
        // NaN never wins; a key outside the logits scores nothing.
        let nan = score_query(&logits_with(&[(key, f32::NAN)]), key);
        assert_eq!(nan.key_credit, 0.0);
        assert_eq!(score_query(&[1.0; 3], key).key_credit, 0.0);
        assert!(score_query(&[1.0; 3], 7).log_probability.is_nan());
    }

    /// The accounting of a hand-built set: each query lands in its distance's bucket, the control
    /// apart, and the means are over each group's sequences.
    #[test]
    fn a_set_is_scored_per_bucket_and_control() {
        let s = 32; // buckets 1-2, 3-8, 9-24, 25-30
        let sequence = |key: u32, distance| RecallSequence::new(s, key, distance).unwrap();
        let set = [sequence(0, Some(1)), sequence(1, Some(2)), sequence(2, Some(30)), sequence(3, None)];
        let right = |key: u32| logits_with(&[(FIRST_KEY + key, 4.0)]);
        let wrong = |key: u32| logits_with(&[(FIRST_KEY + (key + 1) % RECALL_KEYS, 4.0)]);
        let evaluation = score_set(&set, &[right(0), wrong(1), right(2), right(3)]);
        assert_eq!(evaluation.buckets.len(), 2, "empty buckets are left out");
        let (near, far) = (evaluation.buckets[0], evaluation.buckets[1]);
        assert_eq!((near.distances, near.sequences, near.key_accuracy), (Some((1, 2)), 2, 0.5));
        assert_eq!((far.distances, far.sequences, far.key_accuracy), (Some((25, 30)), 1, 1.0));
        let control = evaluation.key_removed;
        assert_eq!((control.distances, control.sequences, control.key_accuracy), (None, 1, 1.0));
        let p = 4f64.exp() / (4f64.exp() + 15.0);
        assert!((far.answer_probability - p).abs() < 1e-12);
        assert!((near.answer_loss - (-(p.ln()) - (1.0 / (4f64.exp() + 15.0)).ln()) / 2.0).abs() < 1e-12);
    }
}
