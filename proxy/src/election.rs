//! The Election service (v3election), forwarded; under a namespace, election names and
//! leader keys are moved into it and back.

use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use crate::forward::call_upstream;
use crate::pb::v3electionpb::*;
use crate::state::State;
use crate::upstream::fresh;

/// etcd's Election service.
pub(crate) struct ElectionService {
    st: Arc<State>,
}

impl ElectionService {
    pub(crate) fn new(st: Arc<State>) -> Self {
        ElectionService { st }
    }

    fn leader_in(&self, l: &mut Option<LeaderKey>) {
        if let Some(l) = l.as_mut() {
            l.name = self.st.ns.key(&l.name);
            l.key = self.st.ns.key(&l.key);
        }
    }

    fn leader_out(&self, l: &mut Option<LeaderKey>) {
        if let Some(l) = l.as_mut() {
            l.name = self.st.ns.strip(std::mem::take(&mut l.name));
            l.key = self.st.ns.strip(std::mem::take(&mut l.key));
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
        let md = req.metadata().clone();
        let mut r = req.into_inner();
        r.name = self.st.ns.key(&r.name);
        let up = &self.st.up;
        let mut resp = call_upstream!(up, &md, r, election.campaign)
            .await?
            .into_inner();
        self.leader_out(&mut resp.leader);
        Ok(Response::new(resp))
    }

    async fn proclaim(
        &self,
        req: Request<ProclaimRequest>,
    ) -> Result<Response<ProclaimResponse>, Status> {
        let md = req.metadata().clone();
        let mut r = req.into_inner();
        self.leader_in(&mut r.leader);
        let up = &self.st.up;
        call_upstream!(up, &md, r, election.proclaim)
            .await
            .map(fresh)
    }

    async fn leader(
        &self,
        req: Request<LeaderRequest>,
    ) -> Result<Response<LeaderResponse>, Status> {
        let md = req.metadata().clone();
        let mut r = req.into_inner();
        r.name = self.st.ns.key(&r.name);
        let up = &self.st.up;
        let mut resp = call_upstream!(up, &md, r, election.leader)
            .await?
            .into_inner();
        if let Some(kv) = resp.kv.as_mut() {
            self.st.ns.kv_out(kv);
        }
        Ok(Response::new(resp))
    }

    type ObserveStream = ObserveStream;

    async fn observe(
        &self,
        req: Request<LeaderRequest>,
    ) -> Result<Response<ObserveStream>, Status> {
        let md = req.metadata().clone();
        let mut r = req.into_inner();
        r.name = self.st.ns.key(&r.name);
        let up = &self.st.up;
        let stream = call_upstream!(up, &md, r, election.observe)
            .await?
            .into_inner();
        let ns = self.st.ns.clone();
        let stream = stream.map(move |r| {
            r.map(|mut r| {
                if let Some(kv) = r.kv.as_mut() {
                    ns.kv_out(kv);
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
        let md = req.metadata().clone();
        let mut r = req.into_inner();
        self.leader_in(&mut r.leader);
        let up = &self.st.up;
        call_upstream!(up, &md, r, election.resign).await.map(fresh)
    }
}
