// Wake-up cost: one message ping-ponged between two processes, the reader
// waiting in a blocking recv ("block"), in poll(2) then recv ("poll"), in
// a non-blocking recv with sched_yield between tries ("yield", Open MPI's
// tcp btl under --oversubscribe) or in a bare non-blocking recv loop
// ("spin"); prints the median, p10 and p90 round trip in µs, each mode
// twice. The gap between "block"/"poll" and "spin" is what sleeping and
// being woken costs (docs/benchmarks.md, collectives across hosts).
// Usage: wakeup unix|tcp|veth [iters] [bytes]
//   unix: a socketpair; tcp: loopback TCP; veth: TCP between the network
//   namespaces named by $WAKE_NS_A (listening on 10.99.7.1) and $WAKE_NS_B,
//   e.g. made with: ip netns add a; ip netns add b; ip link add va type
//   veth peer name vb; ip link set va netns a; ip link set vb netns b;
//   ip -n a addr add 10.99.7.1/24 dev va; ip -n b addr add 10.99.7.2/24
//   dev vb; ip -n a link set va up; ip -n b link set vb up (root).
// Build: cc -O2 -o wakeup docs/bench/peers/wakeup.c
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <errno.h>
#include <time.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <sched.h>
static int veth;
static void ns(const char*n){char p[256];if(!n){fprintf(stderr,"wakeup: set WAKE_NS_A and WAKE_NS_B to the namespaces (see the comment at the top)\n");exit(2);}snprintf(p,256,"/var/run/netns/%s",n);int fd=open(p,O_RDONLY);if(fd<0||setns(fd,CLONE_NEWNET)){perror("setns");exit(1);}close(fd);}

static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
enum {BLOCK, POLL, YIELD, SPIN};
static const char* names[]={"block","poll","yield","spin"};
static void rd(int fd,int mode,char*b,int n){
  int got=0;
  while(got<n){
    if(mode==POLL){struct pollfd p={fd,POLLIN,0};poll(&p,1,1000);}
    ssize_t m=recv(fd,b+got,n-got,mode==BLOCK?0:MSG_DONTWAIT);
    if(m>0){got+=m;continue;}
    if(m<0&&(errno==EAGAIN||errno==EINTR)){ if(mode==YIELD)sched_yield(); continue;}
    perror("recv");exit(1);
  }
}
static void wr(int fd,char*b,int n){int s=0;while(s<n){ssize_t m=send(fd,b+s,n-s,MSG_NOSIGNAL);if(m>0)s+=m;else if(errno!=EAGAIN&&errno!=EINTR){perror("send");exit(1);}}}
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
static void pair(int tcp,int sv[2]){
  if(!tcp){socketpair(AF_UNIX,SOCK_STREAM,0,sv);return;}
  int l=socket(AF_INET,SOCK_STREAM,0);struct sockaddr_in a={0};a.sin_family=AF_INET;a.sin_addr.s_addr=htonl(0x7f000001);
  bind(l,(void*)&a,sizeof a);listen(l,1);socklen_t al=sizeof a;getsockname(l,(void*)&a,&al);
  sv[0]=socket(AF_INET,SOCK_STREAM,0);connect(sv[0],(void*)&a,sizeof a);sv[1]=accept(l,0,0);close(l);
  int one=1;setsockopt(sv[0],IPPROTO_TCP,TCP_NODELAY,&one,4);setsockopt(sv[1],IPPROTO_TCP,TCP_NODELAY,&one,4);
}
int main(int argc,char**argv){
  int tcp=argc>1&&!strcmp(argv[1],"tcp"); veth=argc>1&&!strcmp(argv[1],"veth"); int iters=argc>2?atoi(argv[2]):2000; int size=argc>3?atoi(argv[3]):1;
  if(argc<2||(!tcp&&!veth&&strcmp(argv[1],"unix"))||iters<1||iters>1000000||size<1||size>(64<<20)){fprintf(stderr,"usage: wakeup unix|tcp|veth [iters 1..1000000] [bytes 1..64Mi]\n");return 2;}
  char*b=malloc(size); memset(b,1,size);
  for(int round=0;round<2;round++)
  for(int mode=0;mode<4;mode++){
    int sv[2]; int l=-1; struct sockaddr_in a={0};
    if(veth){ns(getenv("WAKE_NS_A"));l=socket(AF_INET,SOCK_STREAM,0);a.sin_family=AF_INET;a.sin_addr.s_addr=inet_addr("10.99.7.1");a.sin_port=htons(40000+mode+4*round);int one=1;setsockopt(l,SOL_SOCKET,SO_REUSEADDR,&one,4);if(bind(l,(void*)&a,sizeof a)){perror("bind");exit(1);}listen(l,1);}
    else pair(tcp,sv);
    pid_t pid=fork();
    if(pid==0&&veth){ns(getenv("WAKE_NS_B"));sv[1]=socket(AF_INET,SOCK_STREAM,0);if(connect(sv[1],(void*)&a,sizeof a)){perror("connect");exit(1);}int one=1;setsockopt(sv[1],IPPROTO_TCP,TCP_NODELAY,&one,4);}
    else if(veth&&pid>0){sv[0]=accept(l,0,0);close(l);int one=1;setsockopt(sv[0],IPPROTO_TCP,TCP_NODELAY,&one,4);}
    if(pid==0){if(!veth)close(sv[0]);for(int i=0;i<iters+100;i++){rd(sv[1],mode,b,size);wr(sv[1],b,size);}_exit(0);}
    if(!veth)close(sv[1]);
    double*t=malloc(sizeof(double)*iters);
    for(int i=0;i<iters+100;i++){double s=now();wr(sv[0],b,size);rd(sv[0],mode,b,size);if(i>=100)t[i-100]=now()-s;}
    waitpid(pid,0,0);close(sv[0]);
    qsort(t,iters,sizeof(double),cmp);
    printf("%s %-5s %6d B: round trip median %7.1f us  p10 %7.1f  p90 %7.1f\n",veth?"veth":tcp?"tcp ":"unix",names[mode],size,t[iters/2],t[iters/10],t[iters*9/10]);
    free(t);
  }
}
