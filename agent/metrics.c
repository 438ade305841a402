/* metrics.c: the agent's /metrics (Prometheus text format 0.0.4), written through edl/metrics.h
 * from the agent's own state; the server answers from the agent's loop. */
#include "agent.h"

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
    edl_prom_metric(p, "edl_agent_trainer_step", "gauge",
                    "Last step the trainer reported (-1: none).", a->tp.step);
    edl_prom_metric(p, "edl_agent_etcd_errors_total", "counter", "Failed etcd calls of the agent.",
                    a->m.etcd_errors);
    edl_prom_metric(p, "edl_agent_lease_losses_total", "counter",
                    "Times the agent's lease was lost.", a->m.lease_losses);
    p->labels = NULL; /* they live on this stack frame */
}
