//! What the tests and benchmarks of every crate share, once: a real
//! `redis-server` on a free loopback port, free ports, and proptest case
//! counts that `scripts/fuzz.sh` raises.

pub mod cases;
pub mod ports;
pub mod redis;

pub use cases::cases;
pub use ports::free_port;
pub use redis::RedisServer;
