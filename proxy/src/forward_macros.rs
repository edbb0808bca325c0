//! The proxy's two macros, both for unary calls to etcd: `forward!`, one unary method
//! passed to etcd as it is (the services that have nothing to rewrite are lists of
//! these), and `call_upstream!`, the call to etcd that every forwarding method makes.
//! `forward!` expands to the form `#[async_trait]` gives a method, since the attribute
//! runs before the macro does. The file is named for what it holds: macros (used as
//! `crate::forward_macros::{forward, call_upstream}`), where every other file holds a
//! service or a type.

/// Implements a unary method of a generated service trait by forwarding the request to
/// the same method of the upstream client `$client` (a method of `Upstream`).
macro_rules! forward {
    ($method:ident, $client:ident, $req:ty, $resp:ty) => {
        fn $method<'life0, 'async_trait>(
            &'life0 self,
            req: tonic::Request<$req>,
        ) -> ::std::pin::Pin<
            Box<
                dyn ::std::future::Future<Output = Result<tonic::Response<$resp>, tonic::Status>>
                    + Send
                    + 'async_trait,
            >,
        >
        where
            'life0: 'async_trait,
            Self: 'async_trait,
        {
            Box::pin(async move {
                let metadata = req.metadata().clone();
                $crate::forward_macros::call_upstream!(
                    &self.state.upstream,
                    &metadata,
                    req.into_inner(),
                    $client.$method
                )
                .await
                .map($crate::upstream::fresh)
            })
        }
    };
}

/// `upstream.call(metadata, msg, ..)` with the method `$method` of the upstream client `$client`
/// (`Upstream::$client()`): one call to etcd with the client's metadata and nothing of
/// the proxy's (see `Upstream::call`). A future.
macro_rules! call_upstream {
    ($upstream:expr, $metadata:expr, $msg:expr, $client:ident . $method:ident) => {{
        let upstream = $upstream;
        upstream.call($metadata, $msg, |q| {
            let mut c = upstream.$client();
            async move { c.$method(q).await }
        })
    }};
}

pub(crate) use {call_upstream, forward};
