//! The Election service (v3election), forwarded; under a namespace, election names and
//! leader keys are moved into it and back.

use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use crate::forward_macros::call_upstream;
use crate::pb::v3electionpb::*;
use crate::state::State;
use crate::upstream::fresh;

/// etcd's Election service.
pub(crate) struct ElectionService {
    state: Arc<State>,
}

impl ElectionService {
    pub(crate) fn new(state: Arc<State>) -> Self {
        ElectionService { state }
    }

    fn leader_in(&self, l: &mut Option<LeaderKey>) {
        if let Some(l) = l.as_mut() {
            l.name = self.state.namespace.key(&l.name);
            l.key = self.state.namespace.key(&l.key);
        }
    }

    fn leader_out(&self, l: &mut Option<LeaderKey>) {
        if let Some(l) = l.as_mut() {
            l.name = self.state.namespace.strip(std::mem::take(&mut l.name));
            l.key = self.state.namespace.strip(std::mem::take(&mut l.key));
        }
    }
}

type ObserveStream = Pin<Box<dyn Stream<Item = Result<LeaderResponse, Status>> + Send>>;

#[tonic::async_trait]
impl election_server::Election for ElectionService {
    async fn campaign(
        &self,
        req: Request<CampaignRequest>,
    ) -> Result<Response<CampaignResponse>, Status> {
        let metadata = req.metadata().clone();
        let mut r = req.into_inner();
        r.name = self.state.namespace.key(&r.name);
        let upstream = &self.state.upstream;
        let mut resp = call_upstream!(upstream, &metadata, r, election.campaign)
            .await?
            .into_inner();
        self.leader_out(&mut resp.leader);
        Ok(Response::new(resp))
    }

    async fn proclaim(
        &self,
        req: Request<ProclaimRequest>,
    ) -> Result<Response<ProclaimResponse>, Status> {
        let metadata = req.metadata().clone();
        let mut r = req.into_inner();
        self.leader_in(&mut r.leader);
        let upstream = &self.state.upstream;
        call_upstream!(upstream, &metadata, r, election.proclaim)
            .await
            .map(fresh)
    }

    async fn leader(
        &self,
        req: Request<LeaderRequest>,
    ) -> Result<Response<LeaderResponse>, Status> {
        let metadata = req.metadata().clone();
        let mut r = req.into_inner();
        r.name = self.state.namespace.key(&r.name);
        let upstream = &self.state.upstream;
        let mut resp = call_upstream!(upstream, &metadata, r, election.leader)
            .await?
            .into_inner();
        if let Some(kv) = resp.kv.as_mut() {
            self.state.namespace.kv_out(kv);
        }
        Ok(Response::new(resp))
    }

    type ObserveStream = ObserveStream;

    async fn observe(
        &self,
        req: Request<LeaderRequest>,
    ) -> Result<Response<ObserveStream>, Status> {
        let metadata = req.metadata().clone();
        let mut r = req.into_inner();
        r.name = self.state.namespace.key(&r.name);
        let upstream = &self.state.upstream;
        let stream = call_upstream!(upstream, &metadata, r, election.observe)
            .await?
            .into_inner();
        let namespace = self.state.namespace.clone();
        let stream = stream.map(move |r| {
            r.map(|mut r| {
                if let Some(kv) = r.kv.as_mut() {
                    namespace.kv_out(kv);
                }
                r
            })
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn resign(
        &self,
        req: Request<ResignRequest>,
    ) -> Result<Response<ResignResponse>, Status> {
        let metadata = req.metadata().clone();
        let mut r = req.into_inner();
        self.leader_in(&mut r.leader);
        let upstream = &self.state.upstream;
        call_upstream!(upstream, &metadata, r, election.resign)
            .await
            .map(fresh)
    }
}
