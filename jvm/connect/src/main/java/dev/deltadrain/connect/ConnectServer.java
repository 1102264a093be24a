package dev.deltadrain.connect;

import java.lang.reflect.InvocationTargetException;
import java.net.InetSocketAddress;
import java.time.LocalDateTime;
import java.time.format.DateTimeFormatter;

/**
 * The embedded Spark Connect server: Spark's own server (the one its SparkConnectServer class
 * starts), with per-session artifact isolation off.
 *
 * <p>Spark's entry point forces that isolation on. Each Connect session then runs its tasks under a
 * class loader of its own, and Spark's cache of generated classes is keyed by class loader, so the
 * first queries of every new session compile again every class their plans generate
 * (bench/connect_sessions/README.md). deltadrain opens a session per run, and its
 * sessions add no jars, classes or files to share or hide, so on this server they share one class
 * loader and the classes compiled for the runs before them.
 *
 * <p>Spark is reached by reflection, so that this module builds without Spark on its class path
 * (no download) and runs against the Spark that pyspark ships.
 */
public final class ConnectServer {
  private static final String ISOLATION = "spark.sql.artifact.isolation.enabled";
  private static final String SERVICE = "org.apache.spark.sql.connect.service.SparkConnectService$";

  private ConnectServer() {}

  public static void main(String[] args) throws Exception {
    Object builder = invoke(module("org.apache.spark.sql.SparkSession$"), "builder");
    builder.getClass().getMethod("config", String.class, String.class).invoke(builder, ISOLATION, "false");
    Object session = invoke(builder, "getOrCreate");
    Object context = invoke(session, "sparkContext");
    Object service = module(SERVICE);
    try {
      service.getClass().getMethod("start", Class.forName("org.apache.spark.SparkContext"))
          .invoke(service, context);
    } catch (InvocationTargetException e) {
      log("ERROR", "Error starting Spark Connect server: " + e.getCause());
      e.getCause().printStackTrace();
      System.exit(1);
    }
    InetSocketAddress address = (InetSocketAddress) invoke(service, "bindingAddress");
    // The line deltadrain's services and its users look for in the server's log.
    log("INFO", "Spark Connect server started at: " + address.getAddress().getHostAddress() + ":"
        + address.getPort());
    // By its public type: the server's own class is gRPC's internal one, shaded into Spark.
    Class.forName("org.sparkproject.connect.grpc.Server").getMethod("awaitTermination")
        .invoke(invoke(service, "server"));
    invoke(session, "stop");
  }

  private static Object module(String name) throws ReflectiveOperationException {
    return Class.forName(name).getField("MODULE$").get(null);
  }

  private static Object invoke(Object target, String name) throws ReflectiveOperationException {
    return target.getClass().getMethod(name).invoke(target);
  }

  private static void log(String level, String message) {
    String time = LocalDateTime.now().format(DateTimeFormatter.ofPattern("yyyy-MM-dd HH:mm:ss"));
    System.err.println(time + " " + level + " ConnectServer: " + message);
  }
}
