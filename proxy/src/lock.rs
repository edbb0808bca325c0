//! The Lock service (v3lock), forwarded; under a namespace, lock names and keys are
//! moved into it and back.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::forward::call_upstream;
use crate::pb::v3lockpb::*;
use crate::state::State;
use crate::upstream::fresh;

/// etcd's Lock service.
pub(crate) struct LockService {
    st: Arc<State>,
}

impl LockService {
    pub(crate) fn new(st: Arc<State>) -> Self {
        LockService { st }
    }
}

#[tonic::async_trait]
impl lock_server::Lock for LockService {
    async fn lock(&self, req: Request<LockRequest>) -> Result<Response<LockResponse>, Status> {
        let md = req.metadata().clone();
        let mut r = req.into_inner();
        r.name = self.st.ns.key(&r.name);
        let up = &self.st.up;
        let mut resp = call_upstream!(up, &md, r, lock.lock).await?.into_inner();
        resp.key = self.st.ns.strip(std::mem::take(&mut resp.key));
        Ok(Response::new(resp))
    }

    async fn unlock(
        &self,
        req: Request<UnlockRequest>,
    ) -> Result<Response<UnlockResponse>, Status> {
        let md = req.metadata().clone();
        let mut r = req.into_inner();
        r.key = self.st.ns.key(&r.key);
        let up = &self.st.up;
        call_upstream!(up, &md, r, lock.unlock).await.map(fresh)
    }
}
