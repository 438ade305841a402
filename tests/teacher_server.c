/* teacher_server.c: a tiny inference server for the teacher-role tests (not a test itself).
 * It listens on 127.0.0.1:$PORT and answers every GET whose path starts with /v1/models/ with
 * 200 and {"load": L} (L: the number in $T_DIR/<EDL_POD_ID>.load, else 0), anything else with
 * 404. At start it writes its pid to $T_DIR/<EDL_POD_ID>.pid and its environment to
 * $T_DIR/<EDL_POD_ID>.env, so tests can stop, continue and kill it and check what it got. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

extern char **environ;

static void path_of(char *buf, size_t n, const char *ext)
{
    const char *dir = getenv("T_DIR"), *pod = getenv("EDL_POD_ID");
    snprintf(buf, n, "%s/%s.%s", dir ? dir : "/tmp", pod ? pod : "teacher", ext);
}

static void write_files(void)
{
    char p[512];
    path_of(p, sizeof p, "env");
    FILE *f = fopen(p, "w");
    for (char **e = environ; f && *e; e++)
        fprintf(f, "%s\n", *e);
    if (f)
        fclose(f);
    path_of(p, sizeof p, "pid");
    if ((f = fopen(p, "w"))) {
        fprintf(f, "%d\n", (int)getpid());
        fclose(f);
    }
}

static double load_now(void)
{
    char p[512];
    double v = 0;
    path_of(p, sizeof p, "load");
    FILE *f = fopen(p, "r");
    if (f) {
        if (fscanf(f, "%lf", &v) != 1)
            v = 0;
        fclose(f);
    }
    return v;
}

static void serve(int c)
{
    char req[4096];
    size_t n = 0;
    while (n < sizeof req - 1 && !strstr(req, "\r\n\r\n")) {
        ssize_t r = read(c, req + n, sizeof req - 1 - n);
        if (r <= 0)
            return;
        n += (size_t)r;
        req[n] = '\0';
    }
    char body[64], out[256];
    bool ok = strncmp(req, "GET /v1/models/", 15) == 0;
    snprintf(body, sizeof body, "{\"load\": %g}", load_now());
    int len = snprintf(out, sizeof out, "HTTP/1.1 %s\r\nContent-Type: application/json\r\n"
                       "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
                       ok ? "200 OK" : "404 Not Found", strlen(body), body);
    if (write(c, out, (size_t)len) < 0)
        return;
}

int main(void)
{
    const char *port = getenv("PORT");
    if (!port)
        return 2;
    signal(SIGPIPE, SIG_IGN);
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(port))};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    if (bind(s, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(s, 16) != 0) {
        perror("teacher_server: bind");
        return 1;
    }
    write_files();
    for (;;) {
        int c = accept(s, NULL, NULL);
        if (c < 0)
            continue;
        serve(c);
        close(c);
    }
}
