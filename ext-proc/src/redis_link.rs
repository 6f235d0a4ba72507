//! One Redis connection as every Redis user in fleetroute holds it (the
//! tenant counters, the peer link): one multiplexed connection, opened on
//! first use with connect and response timeouts, shared by clones, and
//! dropped after a failed round trip so the next use reconnects. A Redis
//! that is slow or gone costs one timeout per use, never a hang.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, RedisResult};
use tokio::sync::Mutex;

pub struct RedisLink {
    client: Client,
    conn: Mutex<Option<MultiplexedConnection>>,
    timeout: Duration,
}

impl RedisLink {
    /// Checks the URL; connects on first use.
    pub fn open(url: &str, timeout: Duration) -> RedisResult<Self> {
        Ok(RedisLink {
            client: Client::open(url)?,
            conn: Mutex::new(None),
            timeout,
        })
    }

    /// The connection, opened now if there is none.
    pub async fn connection(&self) -> RedisResult<MultiplexedConnection> {
        let mut slot = self.conn.lock().await;
        if let Some(c) = &*slot {
            return Ok(c.clone());
        }
        let cfg = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout));
        let c = self
            .client
            .get_multiplexed_async_connection_with_config(&cfg)
            .await?;
        *slot = Some(c.clone());
        Ok(c)
    }

    /// A round trip failed: the next use opens a new connection.
    pub async fn reset(&self) {
        *self.conn.lock().await = None;
    }
}
