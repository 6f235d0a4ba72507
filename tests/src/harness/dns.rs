//! A DNS server for end-to-end tests: authoritative for a test zone on a
//! free loopback UDP port, in its own thread, with records the test changes
//! at runtime. Every simulated replica listens on 127.0.0.1 with its own
//! port, so a fleet is a set of SRV records (`_engine._tcp.<fleet>.test.` →
//! `127.0.0.1:<port>`), all pointing at one target name with an A record.
//! Stopped (its thread ended, its port closed) when dropped or `stop`ped.

use std::collections::{BTreeSet, HashMap};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::thread;

use hickory_proto::op::{Message, OpCode};
use hickory_proto::rr::rdata::{A, SRV};
use hickory_proto::rr::{Name, RData, Record, RecordType};

/// TTL of every record: short, so a change is seen within the source's floor.
pub const TTL: u32 = 1;
/// The one target every SRV record points at.
const TARGET: &str = "replicas.test.";

#[derive(Default)]
struct Zone {
    /// Lower-case SRV name → ports on 127.0.0.1.
    srv: HashMap<String, BTreeSet<u16>>,
}

pub struct DnsServer {
    pub addr: SocketAddr,
    zone: Arc<Mutex<Zone>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<thread::JoinHandle<()>>,
}

/// The SRV name of `fleet`'s replicas.
pub fn srv_name(fleet: &str) -> String {
    format!("_engine._tcp.{fleet}.test.")
}

impl DnsServer {
    pub fn start() -> DnsServer {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind DNS socket");
        socket.set_nonblocking(true).expect("non-blocking");
        let addr = socket.local_addr().expect("DNS address");
        let zone = Arc::new(Mutex::new(Zone::default()));
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let z = zone.clone();
        let thread = thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("DNS runtime");
            rt.block_on(async move {
                let socket = tokio::net::UdpSocket::from_std(socket).expect("DNS socket");
                tokio::select! {
                    () = serve(socket, z) => {}
                    _ = stopped => {}
                }
            });
        });
        DnsServer {
            addr,
            zone,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Makes `fleet`'s SRV records exactly `addrs` (`127.0.0.1:port` each).
    pub fn set_fleet<'a>(&self, fleet: &str, addrs: impl IntoIterator<Item = &'a String>) {
        let ports = addrs
            .into_iter()
            .map(|a| {
                let a: SocketAddr = a.parse().expect("replica address");
                assert_eq!(a.ip(), Ipv4Addr::LOCALHOST, "replicas listen on loopback");
                a.port()
            })
            .collect();
        self.zone.lock().unwrap().srv.insert(srv_name(fleet), ports);
    }

    /// Stops answering: the port is closed, lookups time out.
    pub fn stop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn serve(socket: tokio::net::UdpSocket, zone: Arc<Mutex<Zone>>) {
    // Requests are a few dozen bytes; anything larger is not a query of ours.
    let mut buf = vec![0u8; 1500];
    loop {
        let Ok((n, peer)) = socket.recv_from(&mut buf).await else {
            return;
        };
        let Ok(request) = Message::from_vec(&buf[..n]) else {
            continue;
        };
        let reply = answer(&request, &zone);
        if let Ok(bytes) = reply.to_vec() {
            let _ = socket.send_to(&bytes, peer).await;
        }
    }
}

fn answer(request: &Message, zone: &Mutex<Zone>) -> Message {
    let zone = zone.lock().unwrap();
    let mut m = Message::response(request.metadata.id, OpCode::Query);
    m.metadata.authoritative = true;
    m.metadata.recursion_desired = request.metadata.recursion_desired;
    m.add_queries(request.queries.clone());
    let target = Name::from_ascii(TARGET).expect("target name");
    for q in &request.queries {
        let name = q.name().to_ascii().to_ascii_lowercase();
        match q.query_type() {
            RecordType::A if name == TARGET => {
                m.add_answer(Record::from_rdata(
                    q.name().clone(),
                    TTL,
                    RData::A(A(Ipv4Addr::LOCALHOST)),
                ));
            }
            RecordType::SRV => {
                for port in zone.srv.get(&name).into_iter().flatten() {
                    let srv = SRV::new(0, 0, *port, target.clone());
                    m.add_answer(Record::from_rdata(q.name().clone(), TTL, RData::SRV(srv)));
                }
            }
            _ => {}
        }
    }
    m
}
