//! Tenants: limits and budgets charged from real usage, counters shared
//! between instances through Redis, and the audit log.
//!
//! Wiring: the router's `Accountant` admits a request once its fleet is
//! chosen (`Ledger::admit`, or `Shared::admit` with Redis) and its `Charge`
//! rides with the decision's load lease until the access log entry commits
//! the real usage; `AuditLog::record` once per request.

pub mod accountant;
pub mod allowance;
pub mod audit;
pub mod charge;
pub mod clock;
pub mod config;
pub mod identity;
pub mod ledger;
pub mod limits;
pub mod price;
pub mod reservation;
pub mod shared;
pub mod tenant;
pub mod window;

#[cfg(test)]
mod tests;
