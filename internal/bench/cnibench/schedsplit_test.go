package cnibench

import (
	"strings"
	"testing"
	"time"
)

func TestABlockedThreadIsFiledUnderWhatItsStackWaitedFor(t *testing.T) {
	cases := []struct {
		name, stack, want string
	}{
		{"a netlink request behind another holder of rtnl", "schedule_preempt_disabled <- __mutex_lock.constprop.0 <- rtnetlink_rcv_msg <- netlink_rcv_skb", "rtnl lock"},
		{"closing a tap queue behind rtnl", "schedule_preempt_disabled <- __mutex_lock.constprop.0 <- tun_chr_close <- __fput", "rtnl lock"},
		{"a TUNSETIFF behind rtnl", "schedule_preempt_disabled <- __mutex_lock.constprop.0 <- __tun_chr_ioctl <- __x64_sys_ioctl", "rtnl lock"},
		{"rcu_barrier's own mutex is the grace period's", "schedule_preempt_disabled <- __mutex_lock.constprop.0 <- rcu_barrier <- netdev_run_todo <- rtnl_dellink", "RCU grace period"},
		{"an expedited grace period under rtnl", "synchronize_rcu_expedited <- unregister_netdevice_many_notify <- rtnl_dellink <- netlink_rcv_skb", "RCU grace period"},
		{"a mutex of kernfs is another lock", "schedule_preempt_disabled <- rwsem_down_write_slowpath <- down_write <- kernfs_add_one", "another kernel lock"},
		{"Go's netpoller", "schedule_hrtimeout_range_clock <- do_epoll_wait <- do_epoll_pwait.part.0 <- __x64_sys_epoll_pwait", "epoll (Go's netpoller: a socket or a child's pipe)"},
		{"reading the config from stdin", "anon_pipe_read <- vfs_read <- ksys_read <- do_syscall_64", "a pipe (stdin, stdout)"},
		{"an idle Go thread is a futex, not a wait for a child", "futex_do_wait <- __futex_wait <- futex_wait <- do_futex", "futex (Go's idle threads)"},
		{"a parent reaping its child", "do_wait <- kernel_wait4 <- __do_sys_wait4 <- do_syscall_64", "a child (wait4)"},
		{"sysmon", "do_nanosleep <- hrtimer_nanosleep <- __x64_sys_nanosleep", "nanosleep (Go's sysmon)"},
		{"anything else", "some_wait <- somewhere", "other"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := className(blockClass(c.stack)); got != c.want {
				t.Errorf("blockClass(%q) = %q, want %q", c.stack, got, c.want)
			}
		})
	}
}

// A process of two threads and a child, as `perf sched timehist --state`
// prints them (times in s, then wait, sch delay and run time in ms).
const timehistSample = `           time    cpu  task name                       wait time  sch delay   run time  state
--------------- ------  ------------------------------  ---------  ---------  ---------  -----
     100.001000 [0000]  plug[500]                           0.000      0.500      0.500      S    anon_pipe_read <- vfs_read
     100.003000 [0000]  plug[500]                           1.500      0.500      0.500      S    futex_do_wait <- __futex_wait
     100.002500 [0001]  plug[501/500]                       0.000      0.000      1.000      D    schedule_preempt_disabled <- __mutex_lock.constprop.0 <- rtnetlink_rcv_msg
     100.006000 [0001]  plug[501/500]                       3.000      1.000      0.500      S    futex_do_wait <- __futex_wait
     100.007000 [0000]  plug[500]                           3.500      0.000      0.500      X    do_task_dead <- do_exit
     100.004000 [0001]  other[600]                          0.000      0.000      1.000      S    do_nanosleep
     100.004200 [0001]  napi/tap0-0[700]                    0.000      0.000      0.200      S    napi_thread_wait <- napi_threaded_poll
`

func TestAChildsTimeCountsInItsParentsLife(t *testing.T) {
	// perf script -F event,trace: the tap plugin's thread 801 forks ip.
	forks, err := parseForks(strings.NewReader(`sched:sched_process_fork: comm=tap pid=800 child_comm=tap child_pid=801
sched:sched_process_fork: comm=tap pid=801 child_comm=tap child_pid=802
sched:sched_switch: prev_comm=tap prev_pid=801 prev_prio=120 prev_state=S ==> next_comm=ip next_pid=802 next_prio=120
`))
	if err != nil {
		t.Fatal(err)
	}
	h, err := parseTimehist(strings.NewReader(`
     200.001000 [0000]  tap[800]                            0.000      0.000      1.000      S    futex_do_wait <- __futex_wait
     200.002000 [0001]  tap[801/800]                        0.000      0.000      1.000      S    do_epoll_wait <- do_epoll_pwait
     200.004000 [0001]  ip[802]                             0.000      0.000      2.000      D    schedule_preempt_disabled <- __mutex_lock.constprop.0 <- rtnetlink_rcv_msg
     200.007000 [0001]  ip[802]                             1.000      0.000      2.000      X    do_task_dead <- do_exit
     200.008000 [0000]  tap[800]                            6.000      0.000      1.000      X    do_task_dead <- do_exit
`))
	if err != nil {
		t.Fatal(err)
	}
	s := sweep(h.tree(800, forks))
	// tap runs .000-.002 (two threads), ip .002-.004, ip in rtnl .004-.005,
	// ip runs .005-.007, tap's thread in epoll for ip .007-.007, tap runs
	// .007-.008.
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	if s.Life != ms(8) || s.OnCPU != ms(7) || s.Blocked["rtnl lock"] != ms(1) {
		t.Errorf("life %v, on CPU %v, rtnl %v, want 8ms, 7ms, 1ms (all: %+v)", s.Life, s.OnCPU, s.Blocked["rtnl lock"], s)
	}
}

func TestAProcessLifeCountsEachInstantOnceInItsMostTellingState(t *testing.T) {
	h, err := parseTimehist(strings.NewReader(timehistSample))
	if err != nil {
		t.Fatal(err)
	}
	s := sweep(h.tree(500, nil))
	// 100.0000-100.0005 waiting, .0005-.0010 on CPU (main), .0010-.0015
	// the main thread blocked on its pipe while its second thread is
	// created, .0015-.0025 on CPU (thread 501), .0025-.0040 main waiting
	// .0020-.0025 then running .0025-.0030; 501 in rtnl from .0025 to
	// .0045, runnable to .0055, running to .0060; main in a futex until it
	// runs .0065-.0070.
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	want := map[string]time.Duration{
		"life":                      ms(7),
		"on CPU":                    ms(0.5 + 1 + 0.5 + 0.5 + 0.5), // .0005-.001, .0015-.0025, .0025-.003, .0055-.006, .0065-.007
		"waiting to run":            ms(0.5 + 1),                   // .0-.0005, .0045-.0055
		"rtnl lock":                 ms(1.5),                       // .003-.0045
		"a pipe (stdin, stdout)":    ms(0.5),                       // .001-.0015
		"futex (Go's idle threads)": ms(0.5),                       // .006-.0065
	}
	got := map[string]time.Duration{"life": s.Life, "on CPU": s.OnCPU, "waiting to run": s.Runnable}
	for k, d := range s.Blocked {
		got[k] = d
	}
	for k, w := range want {
		if d := got[k] - w; d > time.Microsecond || d < -time.Microsecond {
			t.Errorf("%s = %v, want %v (all: %v)", k, got[k], w, got)
		}
	}
	if other := h.spans[600]; len(other) == 0 {
		t.Errorf("another process's events were dropped")
	}
	if got := h.kthreads["NAPI threads"]; got != ms(0.2) {
		t.Errorf("NAPI threads ran %v, want 200µs (all: %v)", got, h.kthreads)
	}
}
