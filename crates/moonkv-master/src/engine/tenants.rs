//! Tenant registration and memory quotas (multi-tenant mode only).
//!
//! Each registered tenant has an account: the requested quota, the effective quota (the request,
//! or a proportional share when requests exceed mounted memory), and the bytes charged. A write
//! is admitted by charging `size × replica_num` up front; the object then carries its own charge
//! and settles it to the memory it really holds, refunding on revoke, expiry and removal.

use super::admin::TenantQuotaSnapshot;
use super::validate::{invalid, tenant_valid};
use super::Engine;
use moonkv_proto::{Error, ErrorCode, Result};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Largest quota a tenant may request (fits an i64 for dashboards).
const MAX_QUOTA_BYTES: u64 = i64::MAX as u64;

#[derive(Debug, Default)]
struct Account {
    requested: AtomicU64,
    effective: AtomicU64,
    charged: AtomicU64,
    admission_closed: AtomicBool,
}

/// All tenant accounts.
#[derive(Debug, Default)]
pub(crate) struct TenantBook {
    accounts: RwLock<HashMap<String, Arc<Account>>>,
}

impl TenantBook {
    fn get(&self, tenant: &str) -> Option<Arc<Account>> {
        self.accounts.read().get(tenant).cloned()
    }

    /// Registered and open for writes.
    pub(crate) fn admits(&self, tenant: &str) -> bool {
        self.get(tenant)
            .is_some_and(|a| !a.admission_closed.load(Ordering::Acquire))
    }

    /// Charges `bytes` if they fit the effective quota. `Err(Some(deficit))` when over quota,
    /// `Err(None)` when the tenant is not registered.
    fn try_charge(&self, tenant: &str, bytes: u64) -> std::result::Result<(), Option<u64>> {
        let account = self.get(tenant).ok_or(None)?;
        let effective = account.effective.load(Ordering::Acquire);
        account
            .charged
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |charged| {
                charged
                    .checked_add(bytes)
                    .filter(|total| *total <= effective)
            })
            .map(|_| ())
            .map_err(|charged| Some(charged.saturating_add(bytes).saturating_sub(effective)))
    }

    /// Charges without a limit (settling an object that already holds the memory).
    pub(crate) fn force_charge(&self, tenant: &str, bytes: u64) {
        if let Some(a) = self.get(tenant) {
            a.charged.fetch_add(bytes, Ordering::AcqRel);
        }
    }

    pub(crate) fn refund(&self, tenant: &str, bytes: u64) {
        if let Some(a) = self.get(tenant) {
            let _ = a
                .charged
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                    Some(c.saturating_sub(bytes))
                });
        }
    }

    /// Recomputes effective quotas for `capacity` bytes of mounted memory: every request when
    /// they all fit, otherwise `floor(capacity × request / Σ requests)` plus the leftover bytes
    /// one each by largest remainder, ties broken by tenant id.
    fn recompute(&self, capacity: u64) {
        let accounts = self.accounts.read();
        let total: u128 = accounts
            .values()
            .map(|a| a.requested.load(Ordering::Acquire) as u128)
            .sum();
        if total <= capacity as u128 {
            for a in accounts.values() {
                a.effective
                    .store(a.requested.load(Ordering::Acquire), Ordering::Release);
            }
            return;
        }
        let mut shares: Vec<(&String, &Arc<Account>, u128)> = Vec::with_capacity(accounts.len());
        let mut assigned: u128 = 0;
        for (name, a) in accounts.iter() {
            let product = capacity as u128 * a.requested.load(Ordering::Acquire) as u128;
            let base = product / total;
            assigned += base;
            a.effective.store(base as u64, Ordering::Release);
            shares.push((name, a, product % total));
        }
        shares.sort_by(|x, y| y.2.cmp(&x.2).then_with(|| x.0.cmp(y.0)));
        let leftover = (capacity as u128).saturating_sub(assigned) as usize;
        for (_, a, _) in shares.iter().take(leftover) {
            a.effective.fetch_add(1, Ordering::AcqRel);
        }
    }

    fn snapshot_of(name: &str, a: &Account) -> TenantQuotaSnapshot {
        let effective = a.effective.load(Ordering::Acquire);
        let charged = a.charged.load(Ordering::Acquire);
        TenantQuotaSnapshot {
            tenant_id: name.to_string(),
            requested_quota_bytes: a.requested.load(Ordering::Acquire),
            effective_quota_bytes: effective,
            charged_bytes: charged,
            admission_closed: a.admission_closed.load(Ordering::Acquire),
            over_quota: charged > effective,
            has_explicit_policy: true,
        }
    }
}

fn unavailable() -> Error {
    Error::new(
        ErrorCode::UNAVAILABLE_IN_CURRENT_MODE,
        "tenant quotas need enable_multi_tenants",
    )
}

impl Engine {
    /// Charges a write's admission bytes, evicting the tenant's own evictable objects (at most
    /// two rounds) when it is over quota. Returns the bytes charged (0 in single-tenant mode).
    pub(crate) fn admit(&self, tenant: &str, bytes: u64) -> Result<u64> {
        if !self.config.enable_multi_tenants {
            return Ok(0);
        }
        for round in 0..3 {
            match self.tenants.try_charge(tenant, bytes) {
                Ok(()) => return Ok(bytes),
                Err(None) => {
                    return Err(Error::new(
                        ErrorCode::TENANT_NOT_REGISTERED,
                        "tenant is not registered",
                    ))
                }
                Err(Some(deficit)) if round < 2 => {
                    self.evict_for_tenant(tenant, deficit);
                }
                Err(Some(_)) => break,
            }
        }
        tracing::debug!(tenant, bytes, "write refused: tenant quota exceeded");
        Err(Error::new(
            ErrorCode::TENANT_QUOTA_EXCEEDED,
            "tenant quota exceeded",
        ))
    }

    /// Returns admission bytes of a write that did not create or grow an object.
    pub(crate) fn refund_admission(&self, tenant: &str, bytes: u64) {
        if bytes > 0 {
            self.tenants.refund(tenant, bytes);
        }
    }

    /// Recomputes effective quotas after mounted memory changed.
    pub(crate) fn recompute_quotas(&self) {
        if self.config.enable_multi_tenants {
            self.tenants
                .recompute(self.usage.capacity.load(Ordering::Acquire));
        }
    }

    /// Quota state of one tenant or of all. `UNAVAILABLE_IN_CURRENT_MODE` unless multi-tenant;
    /// an unknown tenant is `OBJECT_NOT_FOUND`.
    pub fn tenant_quotas(&self, tenant: Option<&str>) -> Result<Vec<TenantQuotaSnapshot>> {
        if !self.config.enable_multi_tenants {
            return Err(unavailable());
        }
        let accounts = self.tenants.accounts.read();
        match tenant {
            Some(name) => accounts
                .get(name)
                .map(|a| vec![TenantBook::snapshot_of(name, a)])
                .ok_or_else(|| {
                    Error::new(
                        ErrorCode::OBJECT_NOT_FOUND,
                        "no quota policy for this tenant",
                    )
                }),
            None => {
                let mut all: Vec<_> = accounts
                    .iter()
                    .map(|(n, a)| TenantBook::snapshot_of(n, a))
                    .collect();
                all.sort_by(|a, b| a.tenant_id.cmp(&b.tenant_id));
                Ok(all)
            }
        }
    }

    /// Registers (or updates) a tenant's quota policy; `requested_quota_bytes` in [1, 2^63-1].
    pub fn set_tenant_quota(
        &self,
        tenant: &str,
        requested_quota_bytes: u64,
    ) -> Result<TenantQuotaSnapshot> {
        if !self.config.enable_multi_tenants {
            return Err(unavailable());
        }
        if !tenant_valid(tenant) {
            return Err(invalid("invalid tenant id"));
        }
        if requested_quota_bytes == 0 || requested_quota_bytes > MAX_QUOTA_BYTES {
            return Err(invalid("requested_quota_bytes must be in [1, 2^63-1]"));
        }
        {
            let mut accounts = self.tenants.accounts.write();
            let account = accounts.entry(tenant.to_string()).or_default();
            account
                .requested
                .store(requested_quota_bytes, Ordering::Release);
            account.admission_closed.store(false, Ordering::Release);
        }
        self.recompute_quotas();
        let account = self
            .tenants
            .get(tenant)
            .ok_or_else(|| Error::from(ErrorCode::INTERNAL_ERROR))?;
        Ok(TenantBook::snapshot_of(tenant, &account))
    }

    /// Deletes a tenant's policy. Admission is closed first so no write sneaks in while the
    /// tenant is checked for objects; `TENANT_NOT_EMPTY` reopens it.
    pub fn delete_tenant_quota(&self, tenant: &str) -> Result<()> {
        if !self.config.enable_multi_tenants {
            return Err(unavailable());
        }
        let account = self.tenants.get(tenant).ok_or_else(|| {
            Error::new(
                ErrorCode::OBJECT_NOT_FOUND,
                "no quota policy for this tenant",
            )
        })?;
        account.admission_closed.store(true, Ordering::Release);
        if self.tenant_object_count(tenant) > 0 {
            account.admission_closed.store(false, Ordering::Release);
            return Err(Error::new(
                ErrorCode::TENANT_NOT_EMPTY,
                "tenant still owns objects",
            ));
        }
        self.tenants.accounts.write().remove(tenant);
        self.recompute_quotas();
        Ok(())
    }

    fn tenant_object_count(&self, tenant: &str) -> usize {
        (0..self.shards.len())
            .map(|i| {
                self.lock_shard(i)
                    .tenants
                    .get(tenant)
                    .map_or(0, |t| t.objects.len())
            })
            .sum()
    }
}
