// Unit tests of the agents' links over the loopback: messages arrive whole and in order, a closed
// peer is noticed, and a connection nobody accepts fails fast.
#include <catch2/catch.hpp>

#include <poll.h>
#include <sys/socket.h>

#include "node_link.h"

using namespace cpprun::launcher;

namespace {

// Polls `link` until `count` messages (or its end) arrived, for at most 5 s.
NodeLink::Received receive_all(NodeLink& link, std::size_t count) {
  NodeLink::Received all;
  for (int i = 0; i < 100 && all.messages.size() < count && !all.closed; ++i) {
    pollfd fd{link.fd(), POLLIN, 0};
    if (poll(&fd, 1, 50) <= 0) continue;
    NodeLink::Received got = link.receive();
    for (NodeMessage& m : got.messages) all.messages.push_back(std::move(m));
    all.closed = got.closed;
    all.bad_line = got.bad_line;
  }
  return all;
}

std::optional<NodeLink> accept_within(LinkListener& listener) {
  for (int i = 0; i < 100; ++i) {
    if (std::optional<NodeLink> link = listener.accept()) return link;
    pollfd fd{listener.fd(), POLLIN, 0};
    poll(&fd, 1, 50);
  }
  return std::nullopt;
}

}  // namespace

TEST_CASE("node_link: messages cross the link in order; closing is noticed", "[node_link]") {
  CHECK(is_loopback_host("127.0.0.1"));
  CHECK(is_loopback_host("localhost"));
  CHECK_FALSE(is_loopback_host("10.1.2.3"));

  LinkListener listener(/*loopback_only=*/true);
  REQUIRE(listener.port() > 0);
  ConnectResult connected = connect_link("127.0.0.1", listener.port(), std::chrono::seconds(5), -1);
  REQUIRE(connected.status == ConnectStatus::kConnected);
  NodeLink& member = *connected.link;
  std::optional<NodeLink> host = accept_within(listener);
  REQUIRE(host);

  for (int round = 0; round < 50; ++round) REQUIRE(member.send(NodeMessage::make_done(round)));
  const NodeLink::Received got = receive_all(*host, 50);
  REQUIRE(got.messages.size() == 50);
  for (int round = 0; round < 50; ++round) CHECK(got.messages[round].round == round);
  CHECK_FALSE(got.closed);

  REQUIRE(host->send(NodeMessage::make_exit({3, false, "bye now"})));
  const NodeLink::Received back = receive_all(member, 1);
  REQUIRE(back.messages.size() == 1);
  CHECK(back.messages[0].end.reason == "bye now");

  host.reset();  // node 0's agent goes away
  CHECK(receive_all(member, 1).closed);
  CHECK(member.fd() < 0);
}

TEST_CASE("node_link: a line that is not a message closes the link", "[node_link]") {
  LinkListener listener(true);
  ConnectResult connected = connect_link("127.0.0.1", listener.port(), std::chrono::seconds(5), -1);
  REQUIRE(connected.status == ConnectStatus::kConnected);
  std::optional<NodeLink> host = accept_within(listener);
  REQUIRE(host);
  REQUIRE(::send(connected.link->fd(), "GET / HTTP/1.1\r\n", 16, 0) == 16);
  const NodeLink::Received got = receive_all(*host, 1);
  CHECK(got.closed);
  CHECK(got.bad_line.find("GET /") == 0);
}

TEST_CASE("node_link: connecting where nobody listens fails at once", "[node_link]") {
  int port = 0;
  {
    LinkListener gone(true);
    port = gone.port();
  }
  const ConnectResult result = connect_link("127.0.0.1", port, std::chrono::seconds(5), -1);
  CHECK(result.status == ConnectStatus::kFailed);
  CHECK_THAT(result.error, Catch::Matchers::Contains("refused"));
}

TEST_CASE("node_link: only one process listens at a c10d endpoint; the others learn why not", "[node_link]") {
  int port = 0;
  {
    LinkListener probe(true);  // a port the kernel says is free
    port = probe.port();
  }
  EndpointListener first = LinkListener::at_endpoint("127.0.0.1", port);
  REQUIRE(first.status == ListenStatus::kListening);
  REQUIRE(first.listener);
  CHECK(first.listener->port() == port);
  // The second agent on this host finds it taken, and joins the first.
  const EndpointListener second = LinkListener::at_endpoint("127.0.0.1", port);
  CHECK(second.status == ListenStatus::kTaken);
  CHECK_FALSE(second.listener);
  ConnectResult connected = connect_link("127.0.0.1", port, std::chrono::seconds(5), -1);
  REQUIRE(connected.status == ConnectStatus::kConnected);
  CHECK(accept_within(*first.listener));

  // An address of another machine (TEST-NET-1, never assigned): not this host's to listen at.
  CHECK(LinkListener::at_endpoint("192.0.2.1", port).status == ListenStatus::kNotHere);
  const EndpointListener nowhere = LinkListener::at_endpoint("no-such-host.invalid", port);
  CHECK(nowhere.status == ListenStatus::kFailed);
  CHECK_THAT(nowhere.error, Catch::Matchers::Contains("no-such-host.invalid"));

  // Once the host is gone the endpoint is free again, even with its connections in TIME_WAIT.
  connected.link.reset();
  first.listener.reset();
  CHECK(LinkListener::at_endpoint("127.0.0.1", port).status == ListenStatus::kListening);
}
