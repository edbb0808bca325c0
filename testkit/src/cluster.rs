//! Three etcd members on loopback: start, kill and restart members, find the leader.

use std::time::{Duration, Instant};

use crate::etcd::{free_port, EtcdOptions, EtcdServer, StartError, START_ATTEMPTS};
use crate::etcd_versions::EtcdBinaries;
use crate::http::MemberStatus;

/// Sets the peer port a front forwards member i to (see [`EtcdCluster::start_fronted`]).
type SetUpstream<'a> = &'a (dyn Fn(usize, u16) + Sync);

/// Three etcd members on loopback, a static `--initial-cluster`.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<EtcdServer>,
}

impl EtcdCluster {
    /// Number of members.
    pub const SIZE: usize = 3;

    /// Starts three members with default options and waits until all are healthy.
    pub fn start() -> EtcdCluster {
        Self::start_with(EtcdOptions::default())
    }

    /// Starts three members with `opts` and waits until all are healthy.
    pub fn start_with(opts: EtcdOptions) -> EtcdCluster {
        Self::start_inner(opts, None)
    }

    /// Starts three members that advertise `fronts[i]` (a forwarder's port on 127.0.0.1)
    /// as member i's peer URL while listening on a peer port of their own, which
    /// `set_upstream(i, port)` hands to the forwarder before the members start (again
    /// when a start is retried on new ports). See [`LaggingCluster`](crate::LaggingCluster).
    pub(crate) fn start_fronted(
        opts: EtcdOptions,
        fronts: &[u16],
        set_upstream: SetUpstream<'_>,
    ) -> EtcdCluster {
        assert_eq!(fronts.len(), Self::SIZE, "one front per member");
        Self::start_inner(opts, Some((fronts, set_upstream)))
    }

    fn start_inner(opts: EtcdOptions, fronts: Option<(&[u16], SetUpstream<'_>)>) -> EtcdCluster {
        let mut last = String::new();
        'attempt: for _ in 0..START_ATTEMPTS {
            let ports: Vec<(u16, u16)> = (0..Self::SIZE)
                .map(|_| (free_port(), free_port()))
                .collect();
            let advertised = |i: usize, peer: u16| fronts.map_or(peer, |(f, _)| f[i]);
            if let Some((_, set_upstream)) = fronts {
                for (i, &(_, peer)) in ports.iter().enumerate() {
                    set_upstream(i, peer);
                }
            }
            let initial_cluster = ports
                .iter()
                .enumerate()
                .map(|(i, &(_, peer))| format!("etcd{i}=http://127.0.0.1:{}", advertised(i, peer)))
                .collect::<Vec<_>>()
                .join(",");
            let mut members: Vec<EtcdServer> = ports
                .iter()
                .enumerate()
                .map(|(i, &(client, peer))| {
                    let mut m =
                        EtcdServer::new(&format!("etcd{i}"), client, peer, &initial_cluster, &opts);
                    m.advertise_peer_port(advertised(i, peer));
                    m
                })
                .collect();
            for m in &mut members {
                if let Err(StartError::PortInUse(msg) | StartError::Failed(msg)) = m.spawn() {
                    panic!("{msg}");
                }
            }
            for i in 0..members.len() {
                match members[i].wait_healthy_inner(opts.start_timeout) {
                    Ok(()) => {}
                    Err(StartError::PortInUse(msg)) => {
                        last = msg;
                        continue 'attempt; // `members` dropped: all killed
                    }
                    Err(StartError::Failed(msg)) => {
                        let others: String = members
                            .iter()
                            .enumerate()
                            .filter(|&(j, _)| j != i)
                            .map(|(_, m)| format!("\n--- log of {}:\n{}", m.name(), m.log_tail(15)))
                            .collect();
                        panic!("etcd cluster failed to start: {msg}{others}");
                    }
                }
            }
            return EtcdCluster { members };
        }
        panic!(
            "etcd cluster could not start after {START_ATTEMPTS} attempts (ports in use): {last}"
        );
    }

    /// Client URLs of all members, in member order (including stopped ones).
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(EtcdServer::endpoint).collect()
    }

    /// Client URLs of the members that are running now.
    pub fn running_endpoints(&mut self) -> Vec<String> {
        self.members
            .iter_mut()
            .filter_map(|m| m.is_running().then(|| m.endpoint()))
            .collect()
    }

    /// Member `i`.
    pub fn member(&self, i: usize) -> &EtcdServer {
        &self.members[i]
    }

    /// Member `i`, mutable.
    pub fn member_mut(&mut self, i: usize) -> &mut EtcdServer {
        &mut self.members[i]
    }

    /// Number of members.
    #[allow(clippy::len_without_is_empty)] // a cluster is never empty
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// SIGKILLs member `i` and waits for it to exit.
    pub fn kill(&mut self, i: usize) {
        self.members[i].kill();
    }

    /// Restarts member `i` on its ports and data dir and waits until it is healthy (which needs
    /// a quorum of members running).
    pub fn restart(&mut self, i: usize) {
        self.members[i].restart();
    }

    /// Stops member `i` cleanly, then starts it on `binaries` with its ports and data dir and
    /// waits until it is healthy: one step of a rolling upgrade (or downgrade).
    pub fn restart_on(&mut self, i: usize, binaries: EtcdBinaries) {
        self.members[i].restart_on(binaries);
    }

    /// The release each member runs (or ran last), in member order, as its binary says.
    pub fn releases(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| {
                m.binaries()
                    .server_version
                    .map_or_else(|| "unknown".to_string(), |v| v.to_string())
            })
            .collect()
    }

    /// Starts every stopped member, then waits until every member is healthy.
    pub fn restart_all(&mut self) {
        for m in &mut self.members {
            if !m.is_running() {
                m.respawn_no_wait();
            }
        }
        for m in &mut self.members {
            m.wait_healthy();
        }
    }

    /// Index of the current leader, as reported by the running members, or `None` when they do
    /// not (yet) agree on one that is running.
    pub fn leader_index(&self) -> Option<usize> {
        let statuses: Vec<Option<MemberStatus>> =
            self.members.iter().map(EtcdServer::status).collect();
        let leader = statuses
            .iter()
            .flatten()
            .map(|s| s.leader)
            .find(|&l| l != 0)?;
        statuses.iter().position(|s| {
            s.as_ref()
                .is_some_and(|s| s.member_id == leader && s.leader == leader)
        })
    }

    /// Index of the current leader; waits up to `timeout` for one to be elected, then panics.
    pub fn wait_for_leader(&self, timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(i) = self.leader_index() {
                return i;
            }
            if Instant::now() >= deadline {
                let logs: String = self
                    .members
                    .iter()
                    .map(|m| format!("\n--- log of {}:\n{}", m.name(), m.log_tail(10)))
                    .collect();
                panic!("no etcd leader within {timeout:?}{logs}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Index of the current leader, waiting up to 15 s for an election.
    pub fn leader(&self) -> usize {
        self.wait_for_leader(Duration::from_secs(15))
    }

    /// Kills the current leader and returns its index.
    pub fn kill_leader(&mut self) -> usize {
        let i = self.leader();
        self.kill(i);
        i
    }
}
