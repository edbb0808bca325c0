//! `forward!`: one unary call passed to etcd as it is (the services that have nothing
//! to rewrite are lists of these), `call_upstream!` (the call to etcd that every
//! forwarding method makes). Both expand to the form
//! `#[async_trait]` gives a method, since the attribute runs before these macros do.

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
                let md = req.metadata().clone();
                $crate::forward::call_upstream!(&self.st.up, &md, req.into_inner(), $client.$method)
                    .await
                    .map($crate::upstream::fresh)
            })
        }
    };
}

/// `up.call(md, msg, ..)` with the method `$method` of the upstream client `$client`
/// (`Upstream::$client()`): one call to etcd with the client's metadata and nothing of
/// the proxy's (see `Upstream::call`). A future.
macro_rules! call_upstream {
    ($up:expr, $md:expr, $msg:expr, $client:ident . $method:ident) => {{
        let up = $up;
        up.call(stringify!($method), $md, $msg, |q| {
            let mut c = up.$client();
            async move { c.$method(q).await }
        })
    }};
}

pub(crate) use {call_upstream, forward};
