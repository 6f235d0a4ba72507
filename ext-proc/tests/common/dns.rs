//! A DNS server for tests: an authoritative UDP responder on loopback for a
//! test zone whose records the tests change at runtime, speaking the wire
//! protocol through hickory-proto's message codec.
// Each test binary that includes it uses a part.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, SRV};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use tokio::net::UdpSocket;
use tokio::task::JoinHandle;

#[derive(Default)]
pub struct Zone {
    /// Lower-case FQDN -> (address, ttl).
    pub addrs: HashMap<String, Vec<(IpAddr, u32)>>,
    /// Lower-case FQDN -> (port, target, ttl).
    pub srv: HashMap<String, Vec<(u16, String, u32)>>,
    pub servfail: bool,
    /// The next this many A queries get an empty (NOERROR, no answer) reply.
    pub empty_a_budget: u32,
}

pub struct DnsServer {
    pub addr: SocketAddr,
    pub zone: Arc<Mutex<Zone>>,
    /// A queries answered, to wait on "the source asked again".
    a_queries: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl DnsServer {
    pub async fn start() -> Self {
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        let zone = Arc::new(Mutex::new(Zone::default()));
        let a_queries = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(serve(socket, zone.clone(), a_queries.clone()));
        Self {
            addr,
            zone,
            a_queries,
            task,
        }
    }

    pub fn set_addrs(&self, name: &str, addrs: &[(&str, u32)]) {
        let list = addrs
            .iter()
            .map(|(ip, ttl)| (ip.parse().unwrap(), *ttl))
            .collect();
        self.zone
            .lock()
            .unwrap()
            .addrs
            .insert(name.to_string(), list);
    }

    pub fn set_srv(&self, name: &str, records: &[(u16, &str)]) {
        let list = records
            .iter()
            .map(|(p, t)| (*p, t.to_string(), 30))
            .collect();
        self.zone.lock().unwrap().srv.insert(name.to_string(), list);
    }

    pub fn set_servfail(&self, on: bool) {
        self.zone.lock().unwrap().servfail = on;
    }

    pub fn a_queries(&self) -> u64 {
        self.a_queries.load(Ordering::SeqCst)
    }

    /// Waits until the source has sent `n` more A queries than `since`.
    pub async fn wait_queries(&self, since: u64, n: u64) {
        let start = Instant::now();
        while self.a_queries() < since + n {
            assert!(
                start.elapsed() < Duration::from_secs(15),
                "timed out waiting for more A queries"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub async fn serve(socket: UdpSocket, zone: Arc<Mutex<Zone>>, a_queries: Arc<AtomicU64>) {
    let mut buf = vec![0u8; 4096];
    loop {
        let Ok((n, peer)) = socket.recv_from(&mut buf).await else {
            return;
        };
        let Ok(request) = Message::from_vec(&buf[..n]) else {
            continue;
        };
        let reply = answer(&request, &zone, &a_queries);
        if let Ok(bytes) = reply.to_vec() {
            let _ = socket.send_to(&bytes, peer).await;
        }
    }
}

fn answer(request: &Message, zone: &Mutex<Zone>, a_queries: &AtomicU64) -> Message {
    let mut zone = zone.lock().unwrap();
    let id = request.metadata.id;
    if zone.servfail {
        let mut m = Message::error_msg(id, OpCode::Query, ResponseCode::ServFail);
        m.add_queries(request.queries.clone());
        return m;
    }
    let mut m = Message::response(id, OpCode::Query);
    m.metadata.authoritative = true;
    m.metadata.recursion_desired = request.metadata.recursion_desired;
    m.add_queries(request.queries.clone());
    for q in &request.queries {
        let name = q.name().to_ascii().to_ascii_lowercase();
        match q.query_type() {
            RecordType::A | RecordType::AAAA => {
                let want_v4 = q.query_type() == RecordType::A;
                if want_v4 {
                    a_queries.fetch_add(1, Ordering::SeqCst);
                    if zone.empty_a_budget > 0 {
                        zone.empty_a_budget -= 1;
                        continue;
                    }
                }
                for (ip, ttl) in zone.addrs.get(&name).into_iter().flatten() {
                    let rdata = match ip {
                        IpAddr::V4(v4) if want_v4 => RData::A(A(*v4)),
                        IpAddr::V6(v6) if !want_v4 => RData::AAAA(AAAA(*v6)),
                        _ => continue,
                    };
                    m.add_answer(Record::from_rdata(q.name().clone(), *ttl, rdata));
                }
            }
            RecordType::SRV => {
                for (port, target, ttl) in zone.srv.get(&name).into_iter().flatten() {
                    let srv = SRV::new(0, 0, *port, Name::from_ascii(target).unwrap());
                    m.add_answer(Record::from_rdata(q.name().clone(), *ttl, RData::SRV(srv)));
                }
            }
            _ => {}
        }
    }
    m
}
