//! Quantities with units, the same on every flag and in every TOML file: token counts, byte
//! counts, byte rates and FLOP rates.
//!
//! - Tokens: a whole number, or with `K`, `M` or `G`, which are binary here as in the paper's tables
//!   (`1M` = 1,048,576; `1G` = 2^30); a fraction is allowed when the count comes out whole (`1.5K`).
//! - Bytes: a number, fractions allowed, with an optional unit: `B`; decimal `K`/`KB`, `M`/`MB`,
//!   `G`/`GB`, `T`/`TB`, `P`/`PB`; binary `KiB`, `MiB`, `GiB`, `TiB`, `PiB`. A bare number is bytes.
//!   The count must come out whole (`1.5KiB` = 1536 bytes; `0.3B` is refused).
//! - Byte rates: a byte count with a unit, `/s` optional (`12.5GB/s`, `25 GiB/s`, `800M`). A bare
//!   number is refused: `12500` read as bytes per second is almost always a mistake for MB/s.
//! - FLOP rates: a number with a decimal prefix, `FLOP/s` optional (`312T`, `989.5TFLOP/s`,
//!   `20GFLOP/s`); a bare number is refused likewise (`1000FLOP/s` gives an exact count).
//!
//! A negative number is refused with a message that says so.

/// A non-negative decimal number as its digits without the point and the count of digits after it
/// (`12.5` is `(125, 1)`).
#[derive(Debug, PartialEq, Eq)]
enum Number {
    Decimal(u128, u32),
    /// More digits than 128 bits hold: certainly too large.
    Huge,
}

/// Splits `text` into a leading decimal number and the rest (the unit, trimmed). `None` when there
/// is no number first.
fn split_number(text: &str) -> Option<(Number, &str)> {
    let end = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (number, unit) = text.split_at(end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
        return None;
    }
    let mut value: Option<u128> = Some(0);
    for digit in whole.bytes().chain(fraction.bytes()) {
        value = value.and_then(|v| v.checked_mul(10)).and_then(|v| v.checked_add(u128::from(digit - b'0')));
    }
    let number = match (value, u32::try_from(fraction.len())) {
        (Some(v), Ok(places)) if places <= 30 => Number::Decimal(v, places),
        (Some(0), _) => Number::Decimal(0, 0),
        _ => Number::Huge,
    };
    Some((number, unit.trim()))
}

/// Why a number times a unit is not a count.
#[derive(Debug, PartialEq, Eq)]
enum Scaled {
    NotWhole,
    TooLarge,
}

/// `number * multiplier` as a whole `u64`.
fn scale(number: &Number, multiplier: u64) -> Result<u64, Scaled> {
    let Number::Decimal(digits, places) = *number else { return Err(Scaled::TooLarge) };
    let product = digits.checked_mul(u128::from(multiplier)).ok_or(Scaled::TooLarge)?;
    let divisor = 10u128.pow(places);
    if product % divisor != 0 {
        return Err(Scaled::NotWhole);
    }
    u64::try_from(product / divisor).map_err(|_| Scaled::TooLarge)
}

/// The byte units and their multipliers.
const BYTE_UNITS: [(&str, u64); 17] = [
    ("B", 1),
    ("K", 1_000),
    ("KB", 1_000),
    ("kB", 1_000),
    ("M", 1_000_000),
    ("MB", 1_000_000),
    ("G", 1_000_000_000),
    ("GB", 1_000_000_000),
    ("T", 1_000_000_000_000),
    ("TB", 1_000_000_000_000),
    ("P", 1_000_000_000_000_000),
    ("PB", 1_000_000_000_000_000),
    ("KiB", 1 << 10),
    ("MiB", 1 << 20),
    ("GiB", 1 << 30),
    ("TiB", 1 << 40),
    ("PiB", 1 << 50),
];

fn byte_unit(unit: &str) -> Option<u64> {
    BYTE_UNITS.iter().find(|(name, _)| *name == unit).map(|&(_, multiplier)| multiplier)
}

const MOST_BYTES: &str = "at most 18446744073709551615 bytes (2^64 - 1, about 16 EiB)";

/// Tokens: a whole number, or with K, M or G (binary: 1K = 1024, 1M = 1,048,576, 1G = 2^30).
pub fn parse_tokens(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let expected = "expected a token count such as 32768, 256K, 1M or 1G (K, M and G are binary: 1M = 1,048,576)";
    if let Some(rest) = text.strip_prefix('-') {
        if split_number(rest).is_some() {
            return Err("a token count can't be negative; give one such as 32768, 256K or 1M".to_string());
        }
    }
    let Some((number, unit)) = split_number(text) else { return Err(expected.to_string()) };
    let multiplier = match unit {
        "" => 1,
        "K" | "k" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        _ => return Err(format!("unknown unit {unit:?}; {expected}")),
    };
    match scale(&number, multiplier) {
        Ok(0) => Err(format!("0 tokens is no sequence; {expected}")),
        Ok(tokens) => Ok(tokens),
        Err(Scaled::NotWhole) => Err(format!("not a whole number of tokens; {expected}")),
        Err(Scaled::TooLarge) => Err(format!("too large: at most {} tokens (2^64 - 1)", u64::MAX)),
    }
}

/// Bytes: a number (fractions allowed) with an optional unit, decimal (K, KB .. P, PB) or binary
/// (KiB .. PiB); a bare number is bytes. A well-formed count past 2^64 - 1 bytes is told apart from
/// a malformed one.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let expected = "expected a byte count such as 4096, 80GiB, 1.5TB or 512MB (decimal KB..PB, binary KiB..PiB)";
    if let Some(rest) = text.strip_prefix('-') {
        if split_number(rest).is_some() {
            return Err(format!("a byte count can't be negative; {expected}"));
        }
    }
    let Some((number, unit)) = split_number(text) else { return Err(expected.to_string()) };
    let multiplier = match unit {
        "" => 1,
        unit => byte_unit(unit).ok_or_else(|| format!("unknown unit {unit:?}; {expected}"))?,
    };
    scale(&number, multiplier).map_err(|e| match e {
        Scaled::NotWhole => format!("not a whole number of bytes; {expected}"),
        Scaled::TooLarge => format!("too large: {MOST_BYTES}"),
    })
}

/// A byte rate per second: a byte count with a unit, `/s` optional (12.5GB/s, 25GiB/s). A bare
/// number is refused with the unit it needs; 0 is no rate.
pub fn parse_rate(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let example = "e.g. 12.5GB/s or 25GiB/s (decimal KB/s..PB/s, binary KiB/s..PiB/s)";
    if let Some(rest) = text.strip_prefix('-') {
        if split_number(rest).is_some() {
            return Err(format!("a rate can't be negative; give one {example}"));
        }
    }
    let body = text.strip_suffix("/s").unwrap_or(text).trim_end();
    let Some((number, unit)) = split_number(body) else { return Err(format!("expected a rate, {example}")) };
    if unit.is_empty() {
        return Err(format!("a rate needs a unit, {example}"));
    }
    let multiplier = byte_unit(unit).ok_or_else(|| format!("unknown unit {unit:?}; give a rate {example}"))?;
    match scale(&number, multiplier) {
        Ok(0) => Err(format!("a rate must be above 0, {example}")),
        Ok(rate) => Ok(rate),
        Err(Scaled::NotWhole) => Err("not a whole number of bytes per second".to_string()),
        Err(Scaled::TooLarge) => Err(format!("too large: {MOST_BYTES} per second")),
    }
}

/// A FLOP rate per second: a number with a decimal prefix K, M, G, T or P, `FLOP/s` optional
/// (312T, 989.5TFLOP/s), or an exact count with `FLOP/s` (1000FLOP/s). A bare number is refused;
/// 0 is no rate.
pub fn parse_flops(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let example = "e.g. 312T or 312TFLOP/s (decimal prefixes K, M, G, T, P)";
    if let Some(rest) = text.strip_prefix('-') {
        if split_number(rest).is_some() {
            return Err(format!("a FLOP rate can't be negative; give one {example}"));
        }
    }
    let (body, named) = match ["FLOP/s", "FLOPS", "FLOP"].iter().find_map(|s| text.strip_suffix(s)) {
        Some(body) => (body.trim_end(), true),
        None => (text, false),
    };
    let Some((number, prefix)) = split_number(body) else {
        return Err(format!("expected a FLOP rate, {example}"));
    };
    let multiplier = match prefix {
        "" if named => 1,
        "" => return Err(format!("a FLOP rate needs a unit, {example}")),
        "K" | "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        _ => return Err(format!("unknown unit {prefix:?}; give a FLOP rate {example}")),
    };
    match scale(&number, multiplier) {
        Ok(0) => Err(format!("a FLOP rate must be above 0, {example}")),
        Ok(rate) => Ok(rate),
        Err(Scaled::NotWhole) => Err("not a whole number of FLOP per second".to_string()),
        Err(Scaled::TooLarge) => Err(format!("too large: at most {} FLOP/s (2^64 - 1)", u64::MAX)),
    }
}

/// `count` exactly, with the largest decimal prefix (K, M, G, T, P) that leaves a whole part, and
/// `unit` after it: `12.345678901GB/s`, `312TFLOP/s`, `999B/s`. [`parse_rate`] and
/// [`parse_flops`] read it back to the same count.
pub fn exact_decimal(count: u64, unit: &str) -> String {
    const PREFIXES: [(&str, u64); 5] =
        [("P", 1_000_000_000_000_000), ("T", 1_000_000_000_000), ("G", 1_000_000_000), ("M", 1_000_000), ("K", 1_000)];
    let Some(&(prefix, scale)) = PREFIXES.iter().find(|(_, scale)| count >= *scale) else {
        return format!("{count}{unit}");
    };
    let (whole, fraction) = (count / scale, count % scale);
    if fraction == 0 {
        return format!("{whole}{prefix}{unit}");
    }
    let places = scale.ilog10() as usize;
    let digits = format!("{fraction:0places$}");
    format!("{whole}.{}{prefix}{unit}", digits.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_binary_with_k_m_and_g() {
        assert_eq!(parse_tokens("1M"), Ok(1 << 20));
        assert_eq!(parse_tokens("256K"), Ok(256 << 10));
        assert_eq!(parse_tokens("256k"), Ok(256 << 10));
        assert_eq!(parse_tokens("1G"), Ok(1 << 30));
        assert_eq!(parse_tokens("1.5K"), Ok(1536));
        assert_eq!(parse_tokens("4096"), Ok(4096));
        assert!(parse_tokens("0").unwrap_err().contains("0 tokens is no sequence"));
        assert!(parse_tokens("-5").unwrap_err().contains("can't be negative"));
        assert!(parse_tokens("1.1").unwrap_err().contains("not a whole number of tokens"));
        assert!(parse_tokens("1T").unwrap_err().contains("unknown unit"));
        assert!(parse_tokens("99999999999999999M").unwrap_err().contains("too large"));
        assert!(parse_tokens("").is_err() && parse_tokens("M").is_err() && parse_tokens("1..5K").is_err());
    }

    #[test]
    fn bytes_take_decimal_and_binary_units_and_fractions() {
        assert_eq!(parse_bytes("2GiB"), Ok(2 << 30));
        assert_eq!(parse_bytes("512MB"), Ok(512_000_000));
        assert_eq!(parse_bytes("1.5TB"), Ok(1_500_000_000_000));
        assert_eq!(parse_bytes("1.5 KiB"), Ok(1536));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("2PiB"), Ok(2 << 50));
        assert_eq!(parse_bytes("0"), Ok(0));
        assert!(parse_bytes("0.3B").unwrap_err().contains("not a whole number of bytes"));
        assert!(parse_bytes("-1GB").unwrap_err().contains("can't be negative"));
        assert!(parse_bytes("2 lots").unwrap_err().contains("expected a byte count"));
        assert!(parse_bytes("99999999999TiB").unwrap_err().contains("too large"));
        assert!(parse_bytes(&"9".repeat(60)).unwrap_err().contains("too large"));
    }

    #[test]
    fn rates_need_a_unit_and_take_per_second_prefixes_and_fractions() {
        assert_eq!(parse_rate("25GB/s"), Ok(25_000_000_000));
        assert_eq!(parse_rate("12.5GB/s"), Ok(12_500_000_000));
        assert_eq!(parse_rate("25 GiB/s"), Ok(25 << 30));
        assert_eq!(parse_rate("800M"), Ok(800_000_000));
        assert_eq!(parse_rate("1B/s"), Ok(1));
        let bare = parse_rate("12500").unwrap_err();
        assert!(bare.starts_with("a rate needs a unit, e.g. 12.5GB/s"), "{bare}");
        assert!(parse_rate("0GB/s").unwrap_err().contains("above 0"));
        assert!(parse_rate("-1GB/s").unwrap_err().contains("can't be negative"));
        assert!(parse_rate("fast").is_err() && parse_rate("12.5 furlongs/s").is_err());
    }

    #[test]
    fn flop_rates_need_a_prefix_or_flop_per_second() {
        assert_eq!(parse_flops("312T"), Ok(312_000_000_000_000));
        assert_eq!(parse_flops("989.5TFLOP/s"), Ok(989_500_000_000_000));
        assert_eq!(parse_flops("20 GFLOP/s"), Ok(20_000_000_000));
        assert_eq!(parse_flops("1000FLOP/s"), Ok(1000));
        assert!(parse_flops("312000000000000").unwrap_err().starts_with("a FLOP rate needs a unit"));
        assert!(parse_flops("0T").is_err() && parse_flops("-3T").is_err() && parse_flops("3X").is_err());
    }

    #[test]
    fn exact_decimals_read_back_to_the_same_count() {
        assert_eq!(exact_decimal(12_345_678_901, "B/s"), "12.345678901GB/s");
        assert_eq!(exact_decimal(312_000_000_000_000, "FLOP/s"), "312TFLOP/s");
        assert_eq!(exact_decimal(999, "B/s"), "999B/s");
        for count in [1, 999, 1000, 1001, 12_345_678_901, 25 << 30, u64::MAX] {
            assert_eq!(parse_rate(&exact_decimal(count, "B/s")), Ok(count));
            assert_eq!(parse_flops(&exact_decimal(count, "FLOP/s")), Ok(count));
        }
    }
}
