//! Numbers for people: byte counts in binary units, ratios and durations. Integer arithmetic
//! wherever the figure is exact, so the same input prints the same text everywhere.

use std::time::Duration;

const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];

/// A byte count with its exact value and, from 1 KiB on, a rounded binary-unit figure:
/// `2013265920 bytes (1.88 GiB)`, `1000 bytes`.
pub fn bytes(count: u64) -> String {
    if count < 1024 {
        format!("{count} bytes")
    } else {
        format!("{count} bytes ({})", binary_units(count))
    }
}

/// `count` in the largest binary unit that keeps it at or above 1, to two decimals (rounded half
/// up): `1.88 GiB`; plain bytes below 1 KiB: `512 B`.
pub fn binary_units(count: u64) -> String {
    if count < 1024 {
        return format!("{count} B");
    }
    let mut unit = 0;
    while unit + 1 < UNITS.len() && count >> (10 * (unit + 1)) > 0 {
        unit += 1;
    }
    let scale = 1u128 << (10 * unit);
    let hundredths = (u128::from(count) * 100 + scale / 2) / scale;
    format!("{}.{:02} {}", hundredths / 100, hundredths % 100, UNITS[unit])
}

/// `numerator / denominator` to four decimals (rounded half up), or `n/a` when the denominator is 0.
pub fn ratio(numerator: u64, denominator: u64) -> String {
    if denominator == 0 {
        return "n/a".to_string();
    }
    let (n, d) = (u128::from(numerator), u128::from(denominator));
    let ten_thousandths = (n * 10_000 + d / 2) / d;
    format!("{}.{:04}", ten_thousandths / 10_000, ten_thousandths % 10_000)
}

/// Milliseconds with three decimals, as a JSON number.
pub fn millis(elapsed: Duration) -> f64 {
    elapsed.as_micros() as f64 / 1000.0
}

/// A duration for the summary: `0.412 ms`, `3.250 s`.
pub fn duration(elapsed: Duration) -> String {
    if elapsed < Duration::from_secs(1) {
        format!("{:.3} ms", millis(elapsed))
    } else {
        format!("{:.3} s", elapsed.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_show_exact_and_binary_units() {
        assert_eq!(bytes(2_013_265_920), "2013265920 bytes (1.88 GiB)");
        assert_eq!(bytes(0), "0 bytes");
        assert_eq!(bytes(1000), "1000 bytes");
        assert_eq!(binary_units(1023), "1023 B");
        assert_eq!(binary_units(1024), "1.00 KiB");
        assert_eq!(binary_units(1536), "1.50 KiB");
        assert_eq!(binary_units(128_000_000), "122.07 MiB");
        assert_eq!(binary_units(u64::MAX), "16.00 EiB");
    }

    #[test]
    fn ratio_has_four_decimals() {
        assert_eq!(ratio(10, 10), "1.0000");
        assert_eq!(ratio(3, 2), "1.5000");
        assert_eq!(ratio(2, 3), "0.6667");
        assert_eq!(ratio(u64::MAX, 1), format!("{}.0000", u64::MAX));
        assert_eq!(ratio(0, 0), "n/a");
    }
}
