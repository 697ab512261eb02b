mod kv;
mod lease;

pub use kv::KvClientPrefix;
pub use lease::LeaseClientPrefix;
