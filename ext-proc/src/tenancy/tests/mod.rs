mod audit;
mod config;
mod ledger;
mod shared;
