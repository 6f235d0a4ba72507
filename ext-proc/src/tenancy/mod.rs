//! Tenants: limits and budgets charged from real usage, counters shared
//! between instances through Redis, and the audit log.
//!
//! Wiring: `Ledger::admit` (or `Shared::admit`) when a request is admitted,
//! `Ledger::commit` with its real usage when it ends, `AuditLog::record`
//! once per request.

pub mod audit;
pub mod clock;
pub mod config;
pub mod ledger;
pub mod shared;
pub mod window;

#[cfg(test)]
mod tests;
