//! Value types of the config keys. Each accepts what upstream configs and flags write (numbers
//! as text, booleans as 0/1, durations with a unit) and refuses anything else, `null` included,
//! with a [`BadValue`] whose text becomes the reason of the error naming the key.

use crate::engine::AllocationStrategy;
use serde::de::{Deserialize, Deserializer, Error as _};
use serde_json::Value;
use std::net::IpAddr;

/// Why a value was refused.
#[derive(Debug, thiserror::Error)]
pub(super) enum BadValue {
    #[error("expected a whole number, got {0}")]
    NotWholeNumber(Value),
    #[error("{value} is out of range [{min}, {max}]")]
    OutOfRange { value: u64, min: u64, max: u64 },
    #[error("expected a number in [0, 1], got {0}")]
    NotRatio(Value),
    #[error("{0} is out of range [0, 1]")]
    RatioOutOfRange(f64),
    #[error("expected true or false, got {0}")]
    NotBool(Value),
    #[error("expected text, got {0}")]
    NotText(Value),
    #[error("`{0}` is not an IP address")]
    NotIp(String),
    #[error("expected milliseconds, got {0}")]
    NotMillis(Value),
    #[error("`{0}` is not a duration like 500ms, 10s, 30m or 24h")]
    NotDuration(String),
    #[error("unknown unit `{unit}` in `{text}`; use ms, s, m or h")]
    UnknownUnit { unit: String, text: String },
    #[error("`{0}` is too long")]
    TooLong(String),
    #[error("unknown strategy `{0}`; expected random or free_ratio_first")]
    UnknownStrategy(String),
    /// The named file holds no usable secret.
    #[error(transparent)]
    Secret(#[from] moonkv_proto::auth::SecretError),
}

/// Implements `Deserialize` for a value type through a check of the raw value.
macro_rules! checked {
    ($ty:ty, $check:expr) => {
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let value = Value::deserialize(d)?;
                $check(&value).map_err(D::Error::custom)
            }
        }
    };
}

/// A whole number in `[MIN, MAX]`, as a number or as text.
#[derive(Debug)]
pub(super) struct Int<const MIN: u64, const MAX: u64>(pub(super) u64);

impl<'de, const MIN: u64, const MAX: u64> Deserialize<'de> for Int<MIN, MAX> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(d)?;
        let n = match &value {
            Value::Number(n) => n.as_u64(),
            Value::String(s) => s.trim().parse::<u64>().ok(),
            _ => None,
        }
        .ok_or_else(|| D::Error::custom(BadValue::NotWholeNumber(value.clone())))?;
        if !(MIN..=MAX).contains(&n) {
            let (min, max) = (MIN, MAX);
            return Err(D::Error::custom(BadValue::OutOfRange {
                value: n,
                min,
                max,
            }));
        }
        Ok(Int(n))
    }
}

/// A fraction in `[0, 1]`.
#[derive(Debug)]
pub(super) struct Ratio(pub(super) f64);

checked!(Ratio, |value: &Value| {
    let r = match value {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse::<f64>().ok(),
        _ => None,
    }
    .ok_or_else(|| BadValue::NotRatio(value.clone()))?;
    if !(0.0..=1.0).contains(&r) {
        return Err(BadValue::RatioOutOfRange(r));
    }
    Ok(Ratio(r))
});

/// `true`/`false`, also as text or as 1/0.
#[derive(Debug)]
pub(super) struct Flag(pub(super) bool);

checked!(Flag, |value: &Value| match value {
    Value::Bool(b) => Ok(Flag(*b)),
    Value::String(s) if s == "true" || s == "1" => Ok(Flag(true)),
    Value::String(s) if s == "false" || s == "0" => Ok(Flag(false)),
    Value::Number(n) if n.as_u64() == Some(1) => Ok(Flag(true)),
    Value::Number(n) if n.as_u64() == Some(0) => Ok(Flag(false)),
    _ => Err(BadValue::NotBool(value.clone())),
});

/// Text; a number is taken as its decimal text.
#[derive(Debug)]
pub(super) struct Text(pub(super) String);

fn text(value: &Value) -> Result<String, BadValue> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        _ => Err(BadValue::NotText(value.clone())),
    }
}

checked!(Text, |value: &Value| text(value).map(Text));

/// An IP address.
#[derive(Debug)]
pub(super) struct Ip(pub(super) IpAddr);

checked!(Ip, |value: &Value| {
    let text = text(value)?;
    text.parse().map(Ip).map_err(|_| BadValue::NotIp(text))
});

/// Milliseconds, from a number (ms) or text with a unit: `250ms`, `10s`, `30m`, `24h`.
#[derive(Debug)]
pub(super) struct Millis(pub(super) u64);

checked!(Millis, |value: &Value| {
    if let Value::Number(n) = value {
        return n
            .as_u64()
            .map(Millis)
            .ok_or_else(|| BadValue::NotMillis(value.clone()));
    }
    let text = text(value)?;
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| BadValue::NotDuration(text.to_string()))?;
    let scale = match unit {
        "" | "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => {
            let (unit, text) = (unit.to_string(), text.to_string());
            return Err(BadValue::UnknownUnit { unit, text });
        }
    };
    n.checked_mul(scale)
        .map(Millis)
        .ok_or_else(|| BadValue::TooLong(text.to_string()))
});

/// `random` or `free_ratio_first`.
#[derive(Debug)]
pub(super) struct Strategy(pub(super) AllocationStrategy);

checked!(Strategy, |value: &Value| match text(value)?.as_str() {
    "random" => Ok(Strategy(AllocationStrategy::Random)),
    "free_ratio_first" => Ok(Strategy(AllocationStrategy::FreeRatioFirst)),
    other => Err(BadValue::UnknownStrategy(other.to_string())),
});

/// For `#[serde(deserialize_with)]`: a key that is present must hold a value, so `null` goes
/// to the value type (which refuses it) instead of meaning "unset".
pub(super) fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}
