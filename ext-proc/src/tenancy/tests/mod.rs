mod audit;
mod config;
mod ledger;
mod redis_server;
mod shared;
