/* metrics.c: the agent's /metrics (Prometheus text format 0.0.4), written through edl/metrics.h
 * from the agent's own state; the server answers from the agent's loop. docs/observability.md
 * says what a dashboard makes of each. */
#include "agent.h"

/* Re-formation takes from under a second (a scale) to minutes (new pods, a checkpoint load). */
static const double REFORM_BOUNDS[] = {0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600};
#define N_REFORM_BOUNDS (sizeof REFORM_BOUNDS / sizeof REFORM_BOUNDS[0])

void agent_metrics_progress(agent *a)
{
    if (a->tp.first_steps == a->m.first_steps_seen)
        return;
    a->m.first_steps_seen = a->tp.first_steps;
    if (!a->have_generation || a->generation.published_ms <= 0 ||
        a->run_gen != edl_generation_of_members(&a->generation))
        return; /* a trainer of an older generation, or a generation we never saw published */
    int64_t ms = a->tp.first_step_wall_ms - a->generation.published_ms;
    a->m.reformation.bounds = REFORM_BOUNDS;
    a->m.reformation.n = N_REFORM_BOUNDS;
    edl_prom_observe(&a->m.reformation, ms > 0 ? (double)ms / 1000.0 : 0.0);
}

/* The trainer's progress: steps, when it last stepped, how long each world took to form, its
 * checkpoints' times and sizes. */
static void write_progress(const agent *a, edl_prom *p)
{
    edl_prom_metric(p, "edl_agent_trainer_step", "gauge",
                    "Last step the trainer reported (-1: none).", a->tp.step);
    edl_prom_metric(p, "edl_agent_trainer_steps_total", "counter",
                    "Forward steps the trainers of this agent reported: rate() is steps per "
                    "second.", a->tp.steps_total);
    edl_prom_family(p, "edl_agent_trainer_last_step_timestamp_seconds", "gauge",
                    "When the step last changed, Unix time (absent: never).");
    if (a->tp.last_step_wall_ms > 0)
        edl_prom_sample(p, "edl_agent_trainer_last_step_timestamp_seconds", NULL, NULL,
                        a->tp.last_step_wall_ms / 1000);
    edl_prom_hist h = a->m.reformation;
    h.bounds = REFORM_BOUNDS;
    h.n = N_REFORM_BOUNDS;
    edl_prom_histogram(p, "edl_agent_reformation_seconds",
                       "From a generation's publication to its trainer's first step here.", &h);
    edl_prom_histogram(p, "edl_agent_checkpoint_save_seconds",
                       "Checkpoint saves the trainers reported, by the time they took.",
                       &a->tp.ckpt_seconds[0]);
    edl_prom_histogram(p, "edl_agent_checkpoint_load_seconds",
                       "Checkpoint loads the trainers reported, by the time they took.",
                       &a->tp.ckpt_seconds[1]);
    edl_prom_family(p, "edl_agent_checkpoint_bytes_total", "counter",
                    "Bytes of the checkpoints the trainers saved and loaded, by operation.");
    edl_prom_sample(p, "edl_agent_checkpoint_bytes_total", "op", "save", a->tp.ckpt_bytes[0]);
    edl_prom_sample(p, "edl_agent_checkpoint_bytes_total", "op", "load", a->tp.ckpt_bytes[1]);
}

/* A distillation student's batches (absent until its trainer reports them). */
static void write_distill(const agent *a, edl_prom *p)
{
    bool on = a->tp.distill_in_flight >= 0;
    edl_prom_family(p, "edl_agent_distill_batches_in_flight", "gauge",
                    "Batches the trainer, a distillation student, has in flight to teachers.");
    if (on)
        edl_prom_sample(p, "edl_agent_distill_batches_in_flight", NULL, NULL,
                        a->tp.distill_in_flight);
    edl_prom_family(p, "edl_agent_distill_retries_total", "counter",
                    "Tries the trainers sent to a teacher again (after a failure, or a removed "
                    "teacher's).");
    if (on)
        edl_prom_sample(p, "edl_agent_distill_retries_total", NULL, NULL, a->tp.distill_retried);
}

void agent_metrics_write(void *arg, edl_prom *p)
{
    const agent *a = arg;
    const char *labels[] = {"job", a->o->job, "pod", a->o->pod, NULL};
    p->labels = labels;
    const edl_member *m = agent_member(a);
    const edl_generation *g = &a->generation;
    edl_prom_metric(p, "edl_agent_up", "gauge", "1 while the agent runs.", 1);
    edl_prom_metric(p, "edl_agent_generation", "gauge",
                    "Latest generation the agent has seen.",
                    a->have_generation ? g->generation : 0);
    edl_prom_metric(p, "edl_agent_rank", "gauge",
                    "This pod's rank in that generation (-1: not a member).", m ? m->rank : -1);
    const edl_member *sv = agent_server(a);
    edl_prom_metric(p, "edl_agent_server_rank", "gauge",
                    "A ps pod's rank among the servers (-1: not a server).", sv ? sv->rank : -1);
    edl_prom_metric(p, "edl_agent_world_size", "gauge", "Members of that generation.",
                    a->have_generation ? (int64_t)g->n_members : 0);
    edl_prom_metric(p, "edl_agent_trainer_restarts_total", "counter",
                    "Trainer starts by this agent after the first.",
                    a->starts > 0 ? a->starts - 1 : 0);
    edl_prom_family(p, "edl_agent_trainer_state", "gauge",
                    "1 for the trainer's current state, 0 for the others.");
    for (int s = EDL_TRAINER_WAITING; s <= EDL_TRAINER_HUNG; s++)
        edl_prom_sample(p, "edl_agent_trainer_state", "state",
                        edl_trainer_state_name((edl_trainer_state)s),
                        a->status.state == (edl_trainer_state)s);
    write_progress(a, p);
    write_distill(a, p);
    edl_prom_metric(p, "edl_agent_etcd_errors_total", "counter", "Failed etcd calls of the agent.",
                    a->m.etcd_errors);
    edl_prom_metric(p, "edl_agent_lease_losses_total", "counter",
                    "Times the agent's lease was lost.", a->m.lease_losses);
    p->labels = NULL; /* they live on this stack frame */
}
