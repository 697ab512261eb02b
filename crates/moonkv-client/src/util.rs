//! Small shared helpers: human sizes (`64MiB`) and fresh ids.

use moonkv_proto::{ClientId, Error, ErrorCode, Result};

/// Parses a byte size such as `4096`, `64MiB`, `1.5GiB`, `16k` or `2GB`.
///
/// Binary units: `K`, `KiB`, `M`, `MiB`, `G`, `GiB`, `T`, `TiB` (powers of 1024). Decimal units:
/// `KB`, `MB`, `GB`, `TB` (powers of 1000). Units are case-insensitive; `B` alone means bytes.
/// Fractions are allowed when the result is a whole number of bytes after rounding down.
pub fn parse_size(text: &str) -> Result<u64> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let bad = |why: &str| {
        Error::new(
            ErrorCode::INVALID_PARAMS,
            format!("cannot read size '{text}': {why}"),
        )
    };
    if number.is_empty() {
        return Err(bad("expected a number, e.g. 64MiB"));
    }
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
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

/// Formats a byte count for people: `512 B`, `4.0 KiB`, `1.5 GiB`.
pub fn format_size(bytes: u64) -> String {
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
    format!("{value:.1} {}", UNITS[unit])
}

/// The shared secret from `MOONKV_AUTH_SECRET[_FILE]`; a bad one is logged and ignored, so
/// the failure surfaces as an authentication error naming the variables.
pub fn secret_from_env() -> Option<moonkv_proto::auth::Secret> {
    logged(moonkv_proto::auth::Secret::from_env())
}

/// The grant secret from `MOONKV_GRANT_SECRET[_FILE]`, like [`secret_from_env`].
pub fn grant_secret_from_env() -> Option<moonkv_proto::auth::Secret> {
    logged(moonkv_proto::auth::Secret::grant_secret_from_env())
}

fn logged(
    found: std::result::Result<Option<moonkv_proto::auth::Secret>, String>,
) -> Option<moonkv_proto::auth::Secret> {
    match found {
        Ok(secret) => secret,
        Err(e) => {
            tracing::warn!(error = %e, "ignoring a secret from the environment");
            None
        }
    }
}

/// A fresh random 128-bit id (clients, nodes, segments generate their own).
pub fn random_client_id() -> ClientId {
    ClientId::new(rand::random(), rand::random())
}

/// Checks a key before it is sent anywhere.
pub(crate) fn check_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(Error::new(ErrorCode::INVALID_KEY, "the key is empty"));
    }
    if key.len() > moonkv_proto::MAX_KEY_LEN {
        return Err(Error::new(
            ErrorCode::INVALID_KEY,
            format!(
                "the key is {} bytes long; the limit is {}",
                key.len(),
                moonkv_proto::MAX_KEY_LEN
            ),
        ));
    }
    Ok(())
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
        for bad in ["", "MiB", "12XB", "1.2.3G", "99999999999TiB", "-1"] {
            let err = parse_size(bad).unwrap_err();
            assert_eq!(err.code, ErrorCode::INVALID_PARAMS, "{bad}");
        }
    }

    #[test]
    fn sizes_format_for_people() {
        assert_eq!(format_size(512), "512 B");
        assert_eq!(format_size(4096), "4.0 KiB");
        assert_eq!(format_size(3 << 29), "1.5 GiB");
    }

    #[test]
    fn keys_are_checked() {
        assert!(check_key("a").is_ok());
        assert_eq!(check_key("").unwrap_err().code, ErrorCode::INVALID_KEY);
        assert_eq!(
            check_key(&"x".repeat(5000)).unwrap_err().code,
            ErrorCode::INVALID_KEY
        );
    }
}
