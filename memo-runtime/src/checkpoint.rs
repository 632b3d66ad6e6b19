//! Checkpoints: the model's parameters, the optimizer state, the step and the data position, in
//! one checksummed file written atomically (a temporary file, synced, renamed over the old one),
//! so a crash never leaves half a checkpoint and resuming continues bit-identically.
//!
//! Layout (little-endian): magic `MEMOCKPT`, version u16, CRC-32 u32 of everything after it,
//! then the config fingerprint u64, step u64, data position u64, the tensor-parallel ranks u32,
//! tensor count u32, and per tensor: kind u8 (0 parameter, 1 optimizer state), role code u16,
//! layer u32 (`u32::MAX` for none), rank u32 (`u32::MAX`: held whole by every rank), byte length
//! u64, the bytes. Version 1 (before tensor parallelism) lacks the ranks and the tensors' rank
//! fields; it is read as one rank.
//!
//! With `t > 1` ranks (`spec/tensor-parallel.md` §2) a checkpoint holds every rank's shard of each
//! sharded parameter and its optimizer state (one tensor per rank, tagged with it), and each
//! replicated one once: the trainer checks that every rank's copy is bit-identical before saving
//! it, and restores it on every rank.

use std::io::Write;
use std::path::Path;

use memo_plan_core::model::ModelConfig;
use memo_plan_core::plan::TensorRole;

const MAGIC: &[u8; 8] = b"MEMOCKPT";
const VERSION: u16 = 2;

/// Which state a tensor is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StateKind {
    /// bf16 parameter.
    Parameter,
    /// fp32 master weights and AdamW moments.
    OptimizerState,
}

/// One saved tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SavedTensor {
    /// Parameter or optimizer state.
    pub kind: StateKind,
    /// Which parameter.
    pub role: TensorRole,
    /// Its layer.
    pub layer: Option<u32>,
    /// The rank whose shard it is; `None`: every rank holds this tensor whole.
    pub rank: Option<u32>,
    /// Its bytes.
    pub bytes: Vec<u8>,
}

/// Everything a resumed run needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    /// [`fingerprint`] of the model the state belongs to.
    pub fingerprint: u64,
    /// Steps taken.
    pub step: u64,
    /// Where the data sampler continues.
    pub data_position: u64,
    /// The tensor-parallel ranks it was saved from (1 on one GPU).
    pub ranks: u32,
    /// Parameters and optimizer state, sorted by (kind, role, layer, rank).
    pub tensors: Vec<SavedTensor>,
}

/// A fingerprint of what the saved state depends on: the model's shape, sequence and
/// micro-batch (not the strategy: every strategy trains the same model bit for bit).
pub fn fingerprint(model: &ModelConfig, seed: u64) -> u64 {
    let fields = [
        u64::from(model.layers),
        model.hidden,
        model.heads,
        model.ffn_hidden,
        model.vocab,
        model.seq_len,
        model.micro_batch,
        seed,
    ];
    // FNV-1a over the fields' bytes: stable across platforms and versions.
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    for byte in fields.iter().flat_map(|f| f.to_le_bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

impl Checkpoint {
    /// The encoded bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::new();
        body.extend_from_slice(&self.fingerprint.to_le_bytes());
        body.extend_from_slice(&self.step.to_le_bytes());
        body.extend_from_slice(&self.data_position.to_le_bytes());
        body.extend_from_slice(&self.ranks.to_le_bytes());
        body.extend_from_slice(&(self.tensors.len() as u32).to_le_bytes());
        for t in &self.tensors {
            body.push(match t.kind {
                StateKind::Parameter => 0,
                StateKind::OptimizerState => 1,
            });
            body.extend_from_slice(&t.role.code().to_le_bytes());
            body.extend_from_slice(&t.layer.unwrap_or(u32::MAX).to_le_bytes());
            body.extend_from_slice(&t.rank.unwrap_or(u32::MAX).to_le_bytes());
            body.extend_from_slice(&(t.bytes.len() as u64).to_le_bytes());
            body.extend_from_slice(&t.bytes);
        }
        let mut out = Vec::with_capacity(body.len() + 14);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// Decodes a checkpoint; every error says what is wrong.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        if bytes.len() < 14 || &bytes[..8] != MAGIC {
            return Err("not a memo checkpoint (bad magic): point --checkpoint at a directory memo train wrote".into());
        }
        let version = u16::from_le_bytes([bytes[8], bytes[9]]);
        if version != VERSION && version != 1 {
            return Err(format!("checkpoint format version {version}; this memo reads versions 1 and {VERSION}"));
        }
        let stored = u32::from_le_bytes([bytes[10], bytes[11], bytes[12], bytes[13]]);
        let body = &bytes[14..];
        if crc32fast::hash(body) != stored {
            return Err("the checkpoint is corrupt (checksum mismatch): restore it or start without --resume".into());
        }
        let mut r = Reader { bytes: body, at: 0 };
        let fingerprint = r.u64()?;
        let step = r.u64()?;
        let data_position = r.u64()?;
        let ranks = if version == 1 { 1 } else { r.u32()? };
        if ranks == 0 {
            return Err("the checkpoint says it holds 0 ranks".into());
        }
        let count = r.u32()?;
        let mut tensors = Vec::new();
        for _ in 0..count {
            let kind = match r.take(1)?[0] {
                0 => StateKind::Parameter,
                1 => StateKind::OptimizerState,
                other => return Err(format!("bad tensor kind {other} at byte {}", r.at)),
            };
            let code = r.u16()?;
            let role = TensorRole::from_code(code).ok_or_else(|| format!("unknown tensor role code {code}"))?;
            let layer = match r.u32()? {
                u32::MAX => None,
                layer => Some(layer),
            };
            let rank = match if version == 1 { u32::MAX } else { r.u32()? } {
                u32::MAX => None,
                rank if rank < ranks => Some(rank),
                rank => return Err(format!("a tensor of rank {rank} in a checkpoint of {ranks} rank(s)")),
            };
            let len = usize::try_from(r.u64()?).map_err(|_| "a tensor longer than memory".to_string())?;
            let bytes = r.take(len)?.to_vec();
            tensors.push(SavedTensor { kind, role, layer, rank, bytes });
        }
        if r.at != body.len() {
            return Err(format!("{} unexpected bytes after the last tensor", body.len() - r.at));
        }
        Ok(Checkpoint { fingerprint, step, data_position, ranks, tensors })
    }

    /// Writes the checkpoint to `dir/checkpoint.memo` atomically.
    pub fn save(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(FILE_NAME);
        let temporary = dir.join(format!(".{FILE_NAME}.tmp{}", std::process::id()));
        let result = (|| {
            let mut file = std::fs::File::create(&temporary)?;
            file.write_all(&self.encode())?;
            file.sync_all()?;
            std::fs::rename(&temporary, &path)?;
            // Make the rename itself durable.
            if let Ok(directory) = std::fs::File::open(dir) {
                let _ = directory.sync_all();
            }
            Ok(())
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&temporary);
        }
        result
    }

    /// Reads `dir/checkpoint.memo`.
    pub fn load(dir: &Path) -> Result<Self, String> {
        let path = dir.join(FILE_NAME);
        let bytes = std::fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Checkpoint::decode(&bytes).map_err(|e| format!("{}: {e}", path.display()))
    }
}

/// The checkpoint's file name inside `--checkpoint DIR`.
pub const FILE_NAME: &str = "checkpoint.memo";

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or_else(|| format!("the checkpoint is truncated at byte {} (needs {n} more)", self.at))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }
    fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().unwrap_or([0; 2])))
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap_or([0; 4])))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap_or([0; 8])))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Checkpoint {
        Checkpoint {
            fingerprint: 7,
            step: 3,
            data_position: 99,
            ranks: 2,
            tensors: vec![
                SavedTensor {
                    kind: StateKind::Parameter,
                    role: TensorRole::Embedding,
                    layer: None,
                    rank: Some(1),
                    bytes: vec![1, 2, 3],
                },
                SavedTensor {
                    kind: StateKind::OptimizerState,
                    role: TensorRole::Fc1Weight,
                    layer: Some(1),
                    rank: None,
                    bytes: vec![9; 12],
                },
            ],
        }
    }

    #[test]
    fn round_trips_and_rejects_corruption() {
        let bytes = sample().encode();
        assert_eq!(Checkpoint::decode(&bytes).unwrap(), sample());
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x40;
            assert!(Checkpoint::decode(&bad).is_err(), "flipping byte {i} went unnoticed");
        }
        assert!(Checkpoint::decode(&bytes[..bytes.len() - 1]).unwrap_err().contains("corrupt"));
    }

    /// A version-1 file (one GPU, before ranks) still reads, as one rank.
    #[test]
    fn reads_version_1() {
        let mut body = Vec::new();
        for field in [7u64, 3, 99] {
            body.extend_from_slice(&field.to_le_bytes());
        }
        body.extend_from_slice(&1u32.to_le_bytes());
        body.push(0);
        body.extend_from_slice(&TensorRole::Embedding.code().to_le_bytes());
        body.extend_from_slice(&u32::MAX.to_le_bytes());
        body.extend_from_slice(&3u64.to_le_bytes());
        body.extend_from_slice(&[1, 2, 3]);
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&1u16.to_le_bytes());
        bytes.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
        bytes.extend_from_slice(&body);
        let read = Checkpoint::decode(&bytes).unwrap();
        assert_eq!((read.ranks, read.step, read.data_position), (1, 3, 99));
        assert_eq!(read.tensors[0].rank, None);
        assert_eq!(read.tensors[0].bytes, [1, 2, 3]);
    }

    #[test]
    fn saves_atomically_into_a_directory() {
        let dir = std::env::temp_dir().join(format!("memo-ckpt-test-{}", std::process::id()));
        sample().save(&dir).unwrap();
        assert_eq!(Checkpoint::load(&dir).unwrap(), sample());
        let leftovers: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(leftovers, [std::ffi::OsString::from(FILE_NAME)]);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
