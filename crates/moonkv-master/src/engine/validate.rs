//! Validation of request fields that crossed a process boundary.

use super::object::PinIntent;
use super::Engine;
use moonkv_proto::{
    Error, ErrorCode, ReplicateConfig, Result, SoftPinAction, TenantId, MAX_KEY_LEN,
};

pub(crate) fn invalid(message: &'static str) -> Error {
    Error::new(ErrorCode::INVALID_PARAMS, message)
}

/// The tenant a request addresses: `""` means `default`.
pub(crate) fn tenant_name(raw: &str) -> &str {
    if raw.is_empty() {
        TenantId::DEFAULT
    } else {
        raw
    }
}

/// Same rule as [`TenantId::is_valid`], without allocating a `TenantId`.
pub(crate) fn tenant_valid(name: &str) -> bool {
    !name.is_empty() && !name.starts_with('_') && !name.bytes().any(|b| b < 0x20 || b == 0x7f)
}

/// Tenant of a read or mutate-existing request.
pub(crate) fn read_tenant(raw: &str) -> Result<&str> {
    let name = tenant_name(raw);
    if tenant_valid(name) {
        Ok(name)
    } else {
        Err(invalid("invalid tenant id"))
    }
}

pub(crate) fn check_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(invalid("key is empty"));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(invalid("key is longer than MAX_KEY_LEN"));
    }
    Ok(())
}

/// The group id of a single-key write: `group_ids`, if present, must hold exactly one entry.
/// An empty group id means ungrouped.
pub(crate) fn single_group(config: &ReplicateConfig) -> Result<Option<&str>> {
    match &config.group_ids {
        None => Ok(None),
        Some(ids) if ids.len() == 1 => Ok(Some(ids[0].as_str()).filter(|g| !g.is_empty())),
        Some(_) => Err(invalid(
            "group_ids must hold exactly one id for a single-key call",
        )),
    }
}

/// Group id of item `i` of a batch whose `group_ids` length was already checked.
pub(crate) fn batch_group(config: &ReplicateConfig, i: usize) -> Option<&str> {
    config
        .group_ids
        .as_ref()
        .and_then(|ids| ids.get(i))
        .map(String::as_str)
        .filter(|g| !g.is_empty())
}

impl Engine {
    /// Tenant of a create-type request (PutStart, UpsertStart and batches). Multi-tenant mode
    /// requires a registered tenant whose admission is open; single-tenant mode only a valid one.
    pub(crate) fn write_tenant<'a>(&self, raw: &'a str) -> Result<&'a str> {
        if !self.config.enable_multi_tenants {
            return read_tenant(raw);
        }
        if raw.is_empty() || !tenant_valid(raw) {
            return Err(Error::new(
                ErrorCode::TENANT_NOT_REGISTERED,
                "tenant is empty or invalid",
            ));
        }
        if !self.tenants.admits(raw) {
            return Err(Error::new(
                ErrorCode::TENANT_NOT_REGISTERED,
                "tenant has no registered quota policy",
            ));
        }
        Ok(raw)
    }

    /// Checks the parts of a write config shared by every key: replica count and soft pin.
    pub(crate) fn check_write_config(&self, config: &ReplicateConfig) -> Result<PinIntent> {
        if config.replica_num == 0 {
            return Err(invalid("replica_num must be at least 1"));
        }
        match (config.soft_pin_action, config.soft_pin_ttl_ms) {
            (SoftPinAction::Unknown(_), _) => Err(invalid("unknown soft_pin_action")),
            (SoftPinAction::Preserve | SoftPinAction::Disable, Some(_)) => Err(invalid(
                "soft_pin_ttl_ms is only allowed with soft_pin_action ENABLE",
            )),
            (SoftPinAction::Preserve, None) => Ok(PinIntent::Preserve),
            (SoftPinAction::Disable, None) => Ok(PinIntent::Clear),
            (SoftPinAction::Enable, ttl) => {
                let ttl = ttl.unwrap_or(self.config.default_kv_soft_pin_ttl_ms);
                if ttl > self.config.max_kv_soft_pin_ttl_ms {
                    Err(invalid("soft_pin_ttl_ms exceeds max_kv_soft_pin_ttl"))
                } else if ttl == 0 {
                    Ok(PinIntent::Clear)
                } else {
                    Ok(PinIntent::Enable(ttl))
                }
            }
        }
    }
}

/// Key and size of one object of a write.
pub(crate) fn check_object(key: &str, size: u64) -> Result<()> {
    check_key(key)?;
    if size == 0 {
        return Err(invalid("size must be non-zero"));
    }
    Ok(())
}
