//! Argument views and element conversions.
//!
//! [`split`] checks a launch's arguments against the op's signature (count, access, byte count)
//! and hands the op its read and written arguments as fixed-size arrays, in signature order. The
//! shape helpers turn a mismatch into an [`OpError`] naming the op, the argument and why.
//!
//! Elements are read and written through little-endian byte chunks, so no alignment is assumed.

use half::bf16;
use memo_plan_core::plan::{Access, Op};

use super::{Arg, ArgData, OpError, OpErrorKind};

/// Bytes of a bf16 element.
pub(crate) const BF16: usize = 2;
/// Bytes of an f32 or u32 element.
pub(crate) const WORD: usize = 4;

/// A read-only argument.
pub(crate) struct In<'s> {
    pub name: &'static str,
    pub bytes: &'s [u8],
    pub first_row: usize,
    pub rows: usize,
    pub row_bytes: usize,
}

/// A written (or read-and-written) argument.
pub(crate) struct Out<'s> {
    pub name: &'static str,
    pub bytes: &'s mut [u8],
    pub rows: usize,
    pub row_bytes: usize,
}

/// Checks `args` against `op`'s signature and splits them into the `R` read-only and the `W`
/// written ones, each in signature order.
pub(crate) fn split<'s, const R: usize, const W: usize>(
    op: Op,
    args: &'s mut [Arg<'_>],
) -> Result<([In<'s>; R], [Out<'s>; W]), OpError> {
    let signature = op.signature();
    if args.len() != signature.len() {
        let kind = OpErrorKind::ArgumentCount { expected: signature.len(), found: args.len() };
        return Err(OpError { op, argument: None, kind });
    }
    let mut reads = Vec::with_capacity(R);
    let mut writes = Vec::with_capacity(W);
    for (arg, &(name, access)) in args.iter_mut().zip(signature) {
        let (rows, row_bytes, first_row) = (arg.rows, arg.row_bytes, arg.first_row);
        let bytes = match &arg.data {
            ArgData::Read(data) => data.len(),
            ArgData::Write(data) => data.len(),
        };
        if rows.checked_mul(row_bytes) != Some(bytes) {
            let kind = OpErrorKind::ByteCount { rows, row_bytes, bytes };
            return Err(OpError { op, argument: Some(name), kind });
        }
        match (&mut arg.data, access) {
            (ArgData::Read(data), Access::Read) => reads.push(In { name, bytes: data, first_row, rows, row_bytes }),
            (ArgData::Write(data), Access::Write | Access::ReadWrite) => {
                writes.push(Out { name, bytes: data, rows, row_bytes })
            }
            (data, expected) => {
                let found = if matches!(data, ArgData::Read(_)) { "read" } else { "write" };
                let kind = OpErrorKind::ArgumentAccess { expected, found };
                return Err(OpError { op, argument: Some(name), kind });
            }
        }
    }
    // The counts follow from the signature; a mismatch here means `R`/`W` disagree with it.
    let internal = |found| OpError { op, argument: None, kind: OpErrorKind::ArgumentCount { expected: R + W, found } };
    let reads: [In<'s>; R] = reads.try_into().map_err(|v: Vec<In<'s>>| internal(v.len()))?;
    let writes: [Out<'s>; W] = writes.try_into().map_err(|v: Vec<Out<'s>>| internal(v.len()))?;
    Ok((reads, writes))
}

/// Shape checks shared by read and written arguments.
pub(crate) trait Shape {
    fn name(&self) -> &'static str;
    fn rows(&self) -> usize;
    fn row_bytes(&self) -> usize;

    fn shape_error(&self, op: Op, expected: String, found: String) -> OpError {
        OpError { op, argument: Some(self.name()), kind: OpErrorKind::Shape { expected, found } }
    }

    /// Elements per row, for elements of `elem_bytes` (`what` names the element type).
    fn elems(&self, op: Op, elem_bytes: usize, what: &str) -> Result<usize, OpError> {
        if !self.row_bytes().is_multiple_of(elem_bytes) {
            let expected = format!("a row of whole {what} elements (a multiple of {elem_bytes} bytes)");
            return Err(self.shape_error(op, expected, format!("{} bytes per row", self.row_bytes())));
        }
        Ok(self.row_bytes() / elem_bytes)
    }

    /// Checks bytes per row: `expected` bytes, `why` says where the number comes from.
    fn want_row_bytes(&self, op: Op, expected: usize, why: &str) -> Result<(), OpError> {
        if self.row_bytes() == expected {
            return Ok(());
        }
        let expected = format!("{expected} bytes per row ({why})");
        Err(self.shape_error(op, expected, format!("{} bytes per row", self.row_bytes())))
    }

    /// Checks bytes per row: `count` elements of `elem_bytes` (`count` may come from another
    /// argument's rows or the context, so the product is checked).
    fn want_elems(&self, op: Op, count: usize, elem_bytes: usize, why: &str) -> Result<(), OpError> {
        match count.checked_mul(elem_bytes) {
            Some(bytes) => self.want_row_bytes(op, bytes, why),
            None => {
                let expected =
                    format!("{count} elements of {elem_bytes} bytes per row ({why}), more than memory holds");
                Err(self.shape_error(op, expected, format!("{} bytes per row", self.row_bytes())))
            }
        }
    }

    /// Checks the row count.
    fn want_rows(&self, op: Op, expected: usize, why: &str) -> Result<(), OpError> {
        if self.rows() == expected {
            return Ok(());
        }
        Err(self.shape_error(op, format!("{expected} rows ({why})"), format!("{} rows", self.rows())))
    }
}

impl Shape for In<'_> {
    fn name(&self) -> &'static str {
        self.name
    }
    fn rows(&self) -> usize {
        self.rows
    }
    fn row_bytes(&self) -> usize {
        self.row_bytes
    }
}

impl Shape for Out<'_> {
    fn name(&self) -> &'static str {
        self.name
    }
    fn rows(&self) -> usize {
        self.rows
    }
    fn row_bytes(&self) -> usize {
        self.row_bytes
    }
}

/// The f32 value of little-endian bf16 bytes (exact).
#[inline]
pub(crate) fn bf16_bits_to_f32(lo: u8, hi: u8) -> f32 {
    f32::from_bits(u32::from(u16::from_le_bytes([lo, hi])) << 16)
}

/// `x` rounded to bf16 (nearest, ties to even; NaN stays NaN), as little-endian bytes.
#[inline]
pub(crate) fn f32_to_bf16_bytes(x: f32) -> [u8; 2] {
    bf16::from_f32(x).to_bits().to_le_bytes()
}

/// `x` rounded to bf16 and back (what storing then loading gives).
#[cfg(test)]
pub(crate) fn round_bf16(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}

/// Converts bf16 bytes into `out` (`bytes.len() == 2 * out.len()`; extra elements are ignored).
pub(crate) fn load_bf16(bytes: &[u8], out: &mut [f32]) {
    for (value, pair) in out.iter_mut().zip(bytes.chunks_exact(BF16)) {
        *value = bf16_bits_to_f32(pair[0], pair[1]);
    }
}

/// bf16 bytes as a vector of f32.
pub(crate) fn bf16_vec(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(BF16).map(|pair| bf16_bits_to_f32(pair[0], pair[1])).collect()
}

/// Rounds `values` to bf16 into `bytes`.
pub(crate) fn store_bf16(values: &[f32], bytes: &mut [u8]) {
    for (pair, &value) in bytes.chunks_exact_mut(BF16).zip(values) {
        pair.copy_from_slice(&f32_to_bf16_bytes(value));
    }
}

/// Little-endian 4-byte words as f32.
pub(crate) fn f32_vec(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(WORD).map(|w| f32::from_le_bytes([w[0], w[1], w[2], w[3]])).collect()
}

/// Little-endian 4-byte words as u32.
pub(crate) fn u32_vec(bytes: &[u8]) -> Vec<u32> {
    bytes.chunks_exact(WORD).map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]])).collect()
}

/// Writes `values` as little-endian f32 into `bytes`.
pub(crate) fn store_f32(values: &[f32], bytes: &mut [u8]) {
    for (word, value) in bytes.chunks_exact_mut(WORD).zip(values) {
        word.copy_from_slice(&value.to_le_bytes());
    }
}

/// The single f32 of a one-row scalar argument (checked by the caller to be 4 bytes).
pub(crate) fn scalar(bytes: &[u8]) -> f32 {
    f32_vec(bytes).first().copied().unwrap_or(0.0)
}

/// An error for a context field the op cannot work with.
pub(crate) fn context_error(op: Op, field: &'static str, problem: String) -> OpError {
    OpError { op, argument: None, kind: OpErrorKind::Context { field, problem } }
}
