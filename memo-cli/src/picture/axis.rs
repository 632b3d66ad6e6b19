//! Axis ticks: round numbers for instruction indices and seconds, binary units for bytes.

const BINARY_UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];

/// A step of 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    if !(raw.is_finite() && raw > 0.0) {
        return 1.0;
    }
    let power = 10f64.powf(raw.log10().floor());
    let fraction = raw / power;
    let nice = if fraction <= 1.0 {
        1.0
    } else if fraction <= 2.0 {
        2.0
    } else if fraction <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * power
}

/// Decimals needed to print multiples of `step` exactly.
fn decimals(step: f64) -> usize {
    if step >= 1.0 {
        0
    } else {
        (-step.log10().floor()).clamp(0.0, 9.0) as usize
    }
}

/// About `target` ticks from 0 to `max` (inclusive where it lands on one): values and labels.
pub fn linear_ticks(max: f64, target: usize) -> Vec<(f64, String)> {
    let step = nice_step(max / target.max(1) as f64);
    let places = decimals(step);
    let mut ticks = Vec::new();
    let mut k = 0u32;
    loop {
        let value = f64::from(k) * step;
        if value > max * (1.0 + 1e-9) || ticks.len() > 50 {
            break;
        }
        let label = if k == 0 { "0".to_string() } else { format!("{value:.places$}") };
        ticks.push((value, label));
        k += 1;
    }
    ticks
}

/// The binary unit a byte axis up to `max` is labelled in: (bytes per unit, name).
pub fn byte_unit(max: u64) -> (u64, &'static str) {
    let mut unit = 0;
    while unit + 1 < BINARY_UNITS.len() && max >> (10 * (unit + 1)) > 0 {
        unit += 1;
    }
    (1u64 << (10 * unit), BINARY_UNITS[unit])
}

/// About `target` byte ticks from 0 to `max`, at round numbers of one binary unit ("20 GiB").
pub fn byte_ticks(max: u64, target: usize) -> Vec<(f64, String)> {
    let (unit, name) = byte_unit(max);
    let in_units = max as f64 / unit as f64;
    linear_ticks(in_units, target)
        .into_iter()
        .map(|(value, label)| (value * unit as f64, format!("{label} {name}")))
        .collect()
}

/// `bytes` in the largest binary unit that keeps it at or above 1, with two decimals.
pub fn bytes_label(bytes: u64) -> String {
    let (unit, name) = byte_unit(bytes);
    if unit == 1 {
        format!("{bytes} B")
    } else {
        format!("{:.2} {name}", bytes as f64 / unit as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round() {
        let ticks = linear_ticks(2359.0, 6);
        assert_eq!(ticks.iter().map(|t| t.1.as_str()).collect::<Vec<_>>(), ["0", "500", "1000", "1500", "2000"]);
        let seconds = linear_ticks(0.9, 5);
        assert_eq!(seconds[1].1, "0.2");
        assert_eq!(linear_ticks(0.0, 5).len(), 1);
    }

    #[test]
    fn byte_ticks_use_one_binary_unit() {
        let ticks = byte_ticks(84 << 30, 5);
        let labels: Vec<&str> = ticks.iter().map(|t| t.1.as_str()).collect();
        assert_eq!(labels, ["0 GiB", "20 GiB", "40 GiB", "60 GiB", "80 GiB"]);
        assert_eq!(byte_ticks(3 << 29, 3)[0].1, "0 GiB", "not 0.0 GiB");
        assert_eq!(ticks[1].0, (20u64 << 30) as f64);
        assert_eq!(byte_ticks(3000, 8)[1].1, "0.5 KiB");
        assert_eq!(bytes_label(512), "512 B");
        assert_eq!(bytes_label(3 << 29), "1.50 GiB");
    }
}
