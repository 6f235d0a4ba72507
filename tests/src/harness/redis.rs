//! The lab's Redis: the test kit's real `redis-server` on a free loopback
//! port, for scenarios of several fleetroute instances and of shared tenant
//! limits (a scenario about Redis fails without it).

pub use fleetroute_test_kit::RedisServer as Redis;
