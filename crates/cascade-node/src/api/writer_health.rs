//! The writer's gRPC health, answered from the writer's own `committing`
//! flag at the moment of the check.
//!
//! tonic-health serves what a `HealthReporter` was last told, and the
//! writer's flag reaches the reporter through a task (`api/server.rs`).
//! A client refused a create for a full disk that asked for health at
//! once could be answered SERVING by a reporter that task had not yet
//! told (`faults::disk_full::a_failing_store_is_retried_with_backoff_and_
//! reopened_then_serves_at_once`, 1 failure in CI). The writer lowers the
//! flag before it answers any refusal, so a check that reads the flag
//! itself never contradicts an answer the client already has.
//!
//! Which names are known (and NOT_FOUND for the others), and `Watch`, stay
//! the reporter's: a watch is a stream of changes, and the task feeds it.

use tokio::sync::watch;
use tonic::{Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_server::Health;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tonic_health::server::HealthService;

/// Every name the writer's node reports (the server, its services and
/// `cascade.v1.Writer`) is SERVING exactly while its writer commits.
pub(crate) struct WriterHealth {
    committing: watch::Receiver<bool>,
    reported: HealthService,
}

impl WriterHealth {
    pub(crate) fn new(committing: watch::Receiver<bool>, reported: tonic_health::server::HealthReporter) -> Self {
        WriterHealth {
            committing,
            reported: HealthService::from_health_reporter(reported),
        }
    }
}

#[tonic::async_trait]
impl Health for WriterHealth {
    async fn check(&self, request: Request<HealthCheckRequest>) -> Result<Response<HealthCheckResponse>, Status> {
        // NOT_FOUND for a name the node does not serve, as before.
        self.reported.check(request).await?;
        let status = if *self.committing.borrow() {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        Ok(Response::new(HealthCheckResponse { status: status as i32 }))
    }

    type WatchStream = <HealthService as Health>::WatchStream;

    async fn watch(&self, request: Request<HealthCheckRequest>) -> Result<Response<Self::WatchStream>, Status> {
        self.reported.watch(request).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_of(service: &str) -> Request<HealthCheckRequest> {
        Request::new(HealthCheckRequest {
            service: service.into(),
        })
    }

    /// No task runs between the flag's change and the check: what the
    /// reporter says is stale, and the answer is the flag's.
    #[tokio::test(flavor = "current_thread")]
    async fn a_check_right_after_the_writer_stops_committing_answers_not_serving_before_the_reporter_is_told() {
        let (reporter, _) = tonic_health::server::health_reporter();
        reporter
            .set_service_status("", tonic_health::ServingStatus::Serving)
            .await;
        let (flag, committing) = watch::channel(true);
        let health = WriterHealth::new(committing, reporter.clone());
        let status = |r: Result<Response<HealthCheckResponse>, Status>| r.map(|r| r.into_inner().status).ok();
        assert_eq!(
            status(health.check(check_of("")).await),
            Some(ServingStatus::Serving as i32)
        );

        flag.send_replace(false);
        assert_eq!(
            status(health.check(check_of("")).await),
            Some(ServingStatus::NotServing as i32)
        );
        flag.send_replace(true);
        assert_eq!(
            status(health.check(check_of("")).await),
            Some(ServingStatus::Serving as i32)
        );

        let unknown = health.check(check_of("no.such.Service")).await.expect_err("not served");
        assert_eq!(unknown.code(), tonic::Code::NotFound);
    }
}
