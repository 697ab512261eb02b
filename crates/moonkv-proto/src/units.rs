//! Human sizes and durations, parsed and printed the same way by every flag, config value and
//! output of moonkv.
//!
//! One rule for bare numbers: a size without a unit is bytes, a duration without a unit is
//! seconds (the unit of upstream's `*_sec` settings).

use crate::error::{Error, ErrorCode, Result};
use std::time::Duration;

fn bad(kind: &str, text: &str, why: &str) -> Error {
    Error::new(
        ErrorCode::INVALID_PARAMS,
        format!("cannot read {kind} '{text}': {why}"),
    )
}

/// Splits `12.5MiB` into `("12.5", "MiB")`.
fn split_number(text: &str) -> (&str, &str) {
    let at = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(at);
    (number, unit.trim())
}

/// Parses a byte size such as `4096`, `64MiB`, `1.5GiB`, `16k` or `2GB`.
///
/// Binary units: `K`, `KiB`, `M`, `MiB`, `G`, `GiB`, `T`, `TiB` (powers of 1024). Decimal units:
/// `KB`, `MB`, `GB`, `TB` (powers of 1000). Units are case-insensitive; `B` alone means bytes.
/// Fractions are allowed and rounded down to a whole number of bytes.
pub fn parse_size(text: &str) -> Result<u64> {
    let trimmed = text.trim();
    let (number, unit) = split_number(trimmed);
    let bad = |why: &str| bad("size", text, why);
    if number.is_empty() {
        return Err(bad("expected a number, e.g. 64MiB"));
    }
    let multiplier: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => {
            return Err(bad(
                "unknown unit (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)",
            ))
        }
    };
    if let Ok(whole) = number.parse::<u64>() {
        return whole
            .checked_mul(multiplier)
            .ok_or_else(|| bad("too large"));
    }
    let value: f64 = number.parse().map_err(|_| bad("not a number"))?;
    let bytes = value * multiplier as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(bad("too large"));
    }
    Ok(bytes as u64)
}

/// Parses a duration such as `10s`, `250ms`, `2m`, `1h` or a bare number of seconds (`1.5`).
pub fn parse_duration(text: &str) -> Result<Duration> {
    let trimmed = text.trim();
    let (number, unit) = split_number(trimmed);
    let bad = |why: &str| bad("duration", text, why);
    let value: f64 = number
        .parse()
        .map_err(|_| bad("expected a number, e.g. 10s, 500ms or 2m"))?;
    let seconds = match unit {
        "" | "s" => value,
        "ms" => value / 1e3,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(bad("unknown unit (use ms, s, m or h)")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|_| bad("out of range"))
}

/// A command-line value that does not parse. It displays the reason alone, because clap
/// already names the flag and the value before it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FlagError(pub std::borrow::Cow<'static, str>);

impl From<Error> for FlagError {
    fn from(error: Error) -> Self {
        FlagError(error.message)
    }
}

/// Clap value parser for a size flag such as `64MiB` (see [`parse_size`]).
pub fn size_flag(text: &str) -> std::result::Result<u64, FlagError> {
    Ok(parse_size(text)?)
}

/// Clap value parser for a positive rate in bytes per second, such as `1MiB`.
pub fn rate_flag(text: &str) -> std::result::Result<u64, FlagError> {
    match parse_size(text)? {
        0 => Err(FlagError("must be more than zero".into())),
        rate => Ok(rate),
    }
}

/// Clap value parser for a duration flag such as `10s`, `500ms` or `1.5` (see
/// [`parse_duration`]); zero is allowed.
pub fn duration_flag(text: &str) -> std::result::Result<Duration, FlagError> {
    Ok(parse_duration(text)?)
}

/// Clap value parser for a duration flag that must be more than zero.
pub fn positive_duration_flag(text: &str) -> std::result::Result<Duration, FlagError> {
    match parse_duration(text)? {
        d if d.is_zero() => Err(FlagError("must be more than zero".into())),
        d => Ok(d),
    }
}

/// Formats a byte count for people with `decimals` digits: `512 B`, `4.0 KiB`, `1.50 GiB`.
pub fn format_size_with(bytes: u64, decimals: usize) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.decimals$} {}", UNITS[unit])
}

/// Formats a byte count for people with one decimal: `512 B`, `4.0 KiB`, `1.5 GiB`.
pub fn format_size(bytes: u64) -> String {
    format_size_with(bytes, 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_in_binary_and_decimal_units() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("1gib").unwrap(), 1 << 30);
        assert_eq!(parse_size("16k").unwrap(), 16 << 10);
        assert_eq!(parse_size("2GB").unwrap(), 2_000_000_000);
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_size(" 8 MiB ").unwrap(), 8 << 20);
        assert_eq!(parse_size("7B").unwrap(), 7);
    }

    #[test]
    fn bad_sizes_are_refused_with_a_reason() {
        for bad in ["", "MiB", "12XB", "1.2.3G", "99999999999TiB", "-1", "50%"] {
            let err = parse_size(bad).unwrap_err();
            assert_eq!(err.code, ErrorCode::INVALID_PARAMS, "{bad}");
            assert!(err.message.contains(bad.trim()), "{}", err.message);
        }
    }

    #[test]
    fn durations_take_a_bare_number_as_seconds() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        for bad in ["soon", "3d", "-1", "", "1e400"] {
            assert_eq!(
                parse_duration(bad).unwrap_err().code,
                ErrorCode::INVALID_PARAMS,
                "{bad}"
            );
        }
    }

    #[test]
    fn sizes_format_for_people() {
        assert_eq!(format_size(512), "512 B");
        assert_eq!(format_size(4096), "4.0 KiB");
        assert_eq!(format_size(3 << 29), "1.5 GiB");
        assert_eq!(format_size_with(3 << 29, 2), "1.50 GiB");
    }

    #[test]
    fn flag_parsers_give_the_reason_alone() {
        assert_eq!(size_flag("64MiB"), Ok(64 << 20));
        assert_eq!(
            rate_flag("0"),
            Err(FlagError("must be more than zero".into()))
        );
        assert_eq!(rate_flag("1KiB"), Ok(1024));
        assert_eq!(duration_flag("0"), Ok(Duration::ZERO));
        assert!(positive_duration_flag("0").is_err());
        assert_eq!(
            positive_duration_flag("250ms"),
            Ok(Duration::from_millis(250))
        );
        let error = size_flag("12 parsecs").unwrap_err().to_string();
        assert!(
            error.starts_with("cannot read size '12 parsecs'"),
            "{error}"
        );
        assert!(!error.contains("INVALID_PARAMS"), "{error}");
    }
}
